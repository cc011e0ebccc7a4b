"""The registry of diagnostic codes (octodsl.lang.codes) is whole: every code octodsl reports is
in it and every code in it is reported, each lint rule declares exactly the codes it reports,
each code is named by some test, and docs/diagnostics.md's tables are what the registry says."""

from __future__ import annotations

import inspect
import re
import runpy

import pytest

from octodsl.lang import codes
from octodsl.lang.codes import CODES, Severity
from octodsl.lang.errors import Diagnostic
from octodsl.lint.rules import RULES, Rule, rule

from ..conftest import REPO

CODE = re.compile(r'"([EW][0-9]{3})"')
REGISTRY = REPO / "octodsl" / "lang" / "codes.py"
GENERATOR = REPO / ".ci" / "diagnostics_doc.py"
DOC = REPO / "docs" / "diagnostics.md"


def reported() -> set[str]:
    """The codes the package's code names (a Diagnostic's code is always a literal somewhere)."""
    return {
        c
        for p in (REPO / "octodsl").rglob("*.py")
        if p != REGISTRY
        for c in CODE.findall(p.read_text())
    }


def test_every_code_reported_is_registered_and_every_registered_code_is_reported():
    assert reported() - set(CODES) == set(), "codes missing from octodsl/lang/codes.py"
    assert set(CODES) - reported() == set(), "octodsl/lang/codes.py lists codes nothing reports"


def test_the_registry_names_each_code_once_with_a_one_line_title():
    ids = [c.id for c in codes._TABLE]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    for c in CODES.values():
        assert re.fullmatch(r"[EW][0-9]{3}", c.id), c.id
        assert c.title and "\n" not in c.title and not c.title.endswith("."), c.id


def test_a_diagnostic_takes_its_severity_from_its_code():
    assert (
        Diagnostic("W401", "m").severity is Severity.WARNING
        and not Diagnostic("W401", "m").is_error
    )
    assert Diagnostic("E302", "m").severity is Severity.ERROR and Diagnostic("E302", "m").is_error
    with pytest.raises(KeyError):  # an unknown code is a programming error, not a silent warning
        _ = Diagnostic("E999", "m").severity


def test_only_warnings_other_than_the_suppressions_own_may_be_ignored():
    assert CODES["W401"].ignorable and CODES["W603"].ignorable
    assert not CODES["E501"].ignorable and not CODES["W803"].ignorable


@pytest.mark.parametrize("cls", RULES, ids=lambda cls: cls.__name__)
def test_each_rule_declares_exactly_the_codes_its_check_reports(cls):
    assert set(CODE.findall(inspect.getsource(cls))) == set(cls.codes)


@pytest.mark.parametrize("declared", [(), ("W401", "E999")])
def test_a_rule_without_codes_or_with_an_unknown_one_is_refused(declared):
    class Bad(Rule):
        codes = declared

    before = list(RULES)
    with pytest.raises(TypeError, match="declares (no code|unknown codes E999)"):
        rule(Bad)
    assert RULES == before


def test_every_code_has_a_test():
    tests = "\n".join(
        p.read_text()
        for p in (REPO / "tests").rglob("*")
        if p.is_file() and p.suffix in (".py", ".txt") and p.name != "test_codes.py"
    )
    assert {c for c in CODES if c not in tests} == set()


# -- docs/diagnostics.md ------------------------------------------------------------------------


def generator() -> dict:
    return runpy.run_path(str(GENERATOR))


def test_the_docs_tables_are_what_the_registry_says():
    text = DOC.read_text()
    assert generator()["render"](text) == text, (
        "docs/diagnostics.md differs from the registry: run `python .ci/diagnostics_doc.py`"
    )


def test_the_docs_list_every_code_once():
    listed = re.findall(r"^\| ([EW][0-9]{3}) \|", DOC.read_text(), re.M)
    assert sorted(listed) == sorted(CODES)


def test_the_generator_keeps_the_prose_and_rewrites_a_stale_table():
    render = generator()["render"]
    text = DOC.read_text()
    stale = text.replace(
        "| W401 | warning | a device holds no stage |", "| W401 | warning | old words |"
    )
    assert stale != text and render(stale) == text
    prose = text.replace("Errors make lint exit 1", "Errors make lint exit one")
    assert render(prose) == prose


def test_the_generator_refuses_a_doc_that_lacks_a_table():
    text = DOC.read_text()
    without = re.sub(r"<!-- codes: csv .*?<!-- end of codes -->\n", "", text, flags=re.S)
    assert without != text
    with pytest.raises(ValueError, match="needs one each of"):
        generator()["render"](without)


def test_the_generator_check_says_how_to_regenerate(tmp_path, monkeypatch, capsys):
    g = generator()
    doc = tmp_path / "diagnostics.md"
    doc.write_text(
        DOC.read_text().replace("| E302 | error | an op appears twice |", "| E302 | error | x |")
    )
    main = g["main"]
    monkeypatch.setitem(main.__globals__, "DOC", doc)
    assert main(["--check"]) == 1
    assert "run `python .ci/diagnostics_doc.py`" in capsys.readouterr().err
    assert main([]) == 0 and main(["--check"]) == 0 and doc.read_text() == DOC.read_text()
