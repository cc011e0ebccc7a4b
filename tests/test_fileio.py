"""octodsl.fileio: a file is replaced whole or not at all; and every writer of octodsl, library
and command line, goes through it (checked by filling the disk halfway through a write)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from octodsl.cli import main
from octodsl.costs.table import Link, uniform_stage_costs
from octodsl.fileio import open_atomic, unwritable, unwritable_folder, write_atomic
from octodsl.gen import generate, generate_text
from octodsl.sim import SimCosts, compile, simulate

OLD = "the user's file, whole\n"


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


class _Full:
    """A file on a disk that fills up: half of the first write goes in, then ENOSPC."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def fill_the_disk(monkeypatch) -> None:
    """Every file opened through os.fdopen (write_atomic's way; open() and Path.write_text
    do not take it, so a writer that bypasses write_atomic is not stopped) fails part-way."""
    real = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **kw: _Full(real(fd, *a, **kw)))


@pytest.fixture
def full_disk(monkeypatch):
    fill_the_disk(monkeypatch)


def test_write_atomic_replaces_and_keeps_the_mode(tmp_path):
    path = tmp_path / "plan.octo"
    path.write_text(OLD)
    path.chmod(0o640)
    write_atomic(path, "new text\n")
    assert path.read_text() == "new text\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    write_atomic(path, b"\x89PNG")
    assert path.read_bytes() == b"\x89PNG" and leftovers(tmp_path) == []


def test_a_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "new.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644


def test_a_link_is_written_through(tmp_path):
    target = tmp_path / "real.octo"
    target.write_text(OLD)
    link = tmp_path / "link.octo"
    link.symlink_to(target)
    write_atomic(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path, full_disk):
    path = tmp_path / "plan.octo"
    path.write_text(OLD)
    with pytest.raises(OSError) as e:
        write_atomic(path, "x" * 1000)
    assert e.value.errno == errno.ENOSPC
    assert path.read_text() == OLD and leftovers(tmp_path) == []


def test_an_exception_inside_open_atomic_changes_nothing(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(OLD)
    with pytest.raises(KeyboardInterrupt):
        with open_atomic(path) as f:
            f.write("half")
            raise KeyboardInterrupt
    assert path.read_text() == OLD and leftovers(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any file")
def test_a_read_only_file_is_refused(tmp_path):
    path = tmp_path / "plan.octo"
    path.write_text(OLD)
    path.chmod(0o444)
    with pytest.raises(PermissionError):
        write_atomic(path, "new")
    assert path.read_text() == OLD


def test_unwritable_says_why(tmp_path):
    (tmp_path / "file").write_text("")
    assert unwritable(tmp_path / "new.md") is None and unwritable(tmp_path / "file") is None
    assert unwritable("") == "no file name given"
    assert unwritable(f"{tmp_path}/") == (
        f"cannot write {tmp_path}/: it ends in '/': give a file's name, not a folder's"
    )
    assert unwritable(tmp_path / "file" / "t.md") == (
        f"cannot write {tmp_path}/file/t.md: there is no folder {tmp_path}/file"
    )


def test_unwritable_folder_says_why(tmp_path):
    (tmp_path / "file").write_text("")
    assert unwritable_folder(tmp_path) is None
    assert unwritable_folder(tmp_path / "new" / "deeper") is None  # made with its parents
    assert unwritable_folder(tmp_path / "file") == (
        f"cannot write {tmp_path}/file: {tmp_path}/file is a file, not a folder"
    )
    assert unwritable_folder(tmp_path / "file" / "plans") == (
        f"cannot write {tmp_path}/file/plans: {tmp_path}/file is a file, not a folder"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any file")
def test_unwritable_names_a_read_only_file_and_folder(tmp_path):
    (tmp_path / "plan.octo").write_text(OLD)
    (tmp_path / "plan.octo").chmod(0o444)
    assert (
        unwritable(tmp_path / "plan.octo") == f"cannot write {tmp_path}/plan.octo: it is read-only"
    )
    tmp_path.chmod(0o555)
    try:
        assert unwritable(tmp_path / "new.octo") == (
            f"cannot write {tmp_path}/new.octo: the folder {tmp_path} is not writable"
        )
        assert unwritable_folder(tmp_path / "plans") == (
            f"cannot write {tmp_path}/plans: the folder {tmp_path} is not writable"
        )
    finally:
        tmp_path.chmod(0o755)


# --- Every writer ----------------------------------------------------------------------------


def _result():
    plan = generate("zb-h1", 2, 4)
    return simulate(compile(plan), uniform_stage_costs(2, 1.0, 1.0, 1.0), Link("l", 0.1, 1e9))


def _profile():
    from tests.calibrate import synthetic as syn

    return syn.profile()


def _comparison(tmp_path):
    from octodsl.calibrate.compare import compare
    from octodsl.calibrate.measured import parse_trace
    from tests.calibrate import synthetic as syn

    plan = syn.plan("1f1b", 2, 4, tmp_path)
    table = syn.profile(syn.TRUE).cost_table("<syn>")
    trace = parse_trace(syn.measured_trace(plan)["traceEvents"])
    return compare(plan, SimCosts.from_table(table, plan), table.calibration.link, trace)


def _write_profile(tmp_path, path):
    from octodsl.costs.profile import write_profile

    write_profile(_profile(), path)


def _sim_trace(tmp_path, path):
    from octodsl.sim.trace import write_trace

    write_trace(_result(), path)


def _gantt(tmp_path, path):
    pytest.importorskip("matplotlib")
    from octodsl.sim.gantt import write_gantt

    write_gantt(_result(), str(path))


def _executor_trace(tmp_path, path):
    from octodsl.trace import op_span, write_trace

    write_trace(path, [op_span(0, "F", 0, 0, 0.0, 1.0)])


def _side_by_side(tmp_path, path):
    from octodsl.calibrate.compare import write_side_by_side

    write_side_by_side(_comparison(tmp_path), path)


def _compare_png(tmp_path, path):
    pytest.importorskip("matplotlib")
    from octodsl.calibrate.compare import write_png

    write_png(_comparison(tmp_path), path)


@pytest.mark.parametrize(
    "name, write",
    [
        ("p.profile.json", _write_profile),
        ("sim.json", _sim_trace),
        ("gantt.png", _gantt),
        ("measured.json", _executor_trace),
        ("side.json", _side_by_side),
        ("side.png", _compare_png),
    ],
)
def test_library_writers_leave_the_old_file_on_a_full_disk(tmp_path, monkeypatch, name, write):
    path = tmp_path / name
    path.write_text(OLD)
    write(tmp_path, path)
    assert path.read_bytes() != OLD.encode()
    path.write_text(OLD)
    fill_the_disk(monkeypatch)
    with pytest.raises(OSError) as e:
        write(tmp_path, path)
    monkeypatch.undo()
    assert e.value.errno == errno.ENOSPC
    assert path.read_text() == OLD and leftovers(tmp_path) == []


def _plans(tmp_path):
    plan = tmp_path / "plan.octo"
    plan.write_text(generate_text("1f1b", 2, 2))
    return plan


@pytest.mark.parametrize(
    "argv, out",
    [
        (["fmt", "{plan}"], "{plan}"),
        (["gen", "1f1b", "-p", "2", "-m", "2", "-o", "{out}.octo"], "{out}.octo"),
        (["convert", "{plan}", "-o", "{out}.csv"], "{out}.csv"),
        (["simulate", "{plan}", "--trace", "{out}.json"], "{out}.json"),
        (["simulate", "{plan}", "--png", "{out}.png"], "{out}.png"),
        (
            [
                "tune",
                "--model",
                "nemotron-h-tiny",
                "-p",
                "2",
                "-m",
                "2",
                "--budget",
                "1s",
                "-o",
                "{out}.octo",
            ],
            "{out}.octo",
        ),
    ],
)
def test_commands_leave_the_old_file_on_a_full_disk(tmp_path, capsys, full_disk, argv, out):
    if "--png" in argv:
        pytest.importorskip("matplotlib")
    plan = _plans(tmp_path)
    if argv[0] == "fmt":
        plan.write_text(plan.read_text().replace("  devices 2", "devices     2"))
    old = plan.read_text() if argv[0] == "fmt" else OLD
    names = {"plan": str(plan), "out": str(tmp_path / "out")}
    target = tmp_path / out.format(**names)
    if argv[0] != "fmt":
        target.write_text(OLD)
    assert main([a.format(**names) for a in argv]) == 2
    err = capsys.readouterr().err
    assert f"{target}: cannot write: No space left on device" in err
    assert target.read_text() == old and leftovers(tmp_path) == []
