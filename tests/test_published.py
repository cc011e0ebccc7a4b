"""benchmarks/published.py: the command lines it prints for a row give the figure it reports,
and its data file is sound (every row cites its source and quotes its figure)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from octodsl.cli import main

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import published  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return {r["id"]: r for r in published.rows(published.load())}


def test_every_row_cites_its_source(rows):
    data = published.load()
    assert len(rows) >= 25 and len({r["source"] for r in rows.values()}) >= 4
    for r in rows.values():
        src = data["sources"][r["source"]]
        assert src["url"].startswith("https://") and src["cite"] and src["engine"]
        assert r["quote"] and r["where"] and r["reported"]["value"] > 0
        assert r["runtime"].get("why"), r["id"]  # how that source's software ran, and why


@pytest.mark.parametrize(
    "row_id",
    [
        "zb2024-t4-1.5b-m24-zb-2p",
        "bloom-176b-production-384",
        "narayanan2021-t1-39.1b",
        # ZeRO 1 with Megatron's param-gather overlap: the plan gen writes must say zero 1
        "megatron-readme-h100-weak-1.7b",
    ],
)
def test_the_printed_commands_give_the_reported_figure(row_id, rows, tmp_path, capsys, monkeypatch):
    result = published.run_row(rows[row_id], {})
    monkeypatch.chdir(REPO)
    gen, sim = result["commands"]
    plan = tmp_path / "plan.octo"
    assert main(shlex.split(gen.removeprefix("octodsl ").replace("plan.octo", str(plan)))) == 0
    capsys.readouterr()
    assert (
        main(shlex.split(sim.removeprefix("octodsl ").replace("plan.octo", str(plan))) + ["--json"])
        == 0
    )
    simulated = json.loads(capsys.readouterr().out)["iteration_time"]
    # the same plan and costs by the same arithmetic: equal to the last digit
    assert simulated == result["iteration_time"]


def test_every_layer_time_cites_its_source():
    data = published.load()
    entries = published.rows(data, "layer_times")
    assert entries
    for e in entries:
        assert data["sources"][e["source"]]["url"].startswith("https://")
        assert e["quote"] and e["where"]
        # a layer's two times, or its combined time as an overhead over the baseline layer's
        assert (e.get("forward_ms", 0) > 0 and e.get("backward_ms", 0) > 0) != (
            "combined_overhead_pct" in e
        )


def test_one_layer_costs_what_its_source_timed():
    # Korthikanti et al.'s Table 4 and Figure 8 (benchmarks/published_layers.md): no constant of
    # the model was fitted to them, so a change to the GEMM, attention-core, memory-bound or
    # tp-collective model that moves a layer's forward, backward or recompute overhead by more
    # than 3% from the published figure shows here.
    import published_layers

    for e in published.rows(published.load(), "layer_times"):
        r = published_layers.measure(e)
        assert max(abs(x) for x in r["errors"]) < 0.03, (e["id"], r["errors"])


def test_the_a100_overheads_are_the_fit_benchmarks_fit_overheads_makes():
    # The constants in devices.py are the fit's output rounded as printed (3 significant
    # figures), so a change to the model's kernels or to the profile shows here.
    import fit_overheads

    from octodsl.costs.devices import MEGATRON_A100_OVERHEADS as o

    fs, bs, fb, bb, msg = fit_overheads.fit(fit_overheads.points(flash=False))
    assert (fs, bs, msg) == pytest.approx((o.f_seconds, o.b_seconds, o.message_seconds), rel=5e-3)
    assert (fb, bb) == pytest.approx((o.f_bytes, o.b_bytes), abs=0.06)


def test_a_benchmark_names_a_file_it_cannot_write_in_one_line(tmp_path, capsys):
    # benchmarks/machine.write_outputs: every benchmark's tables go through it.
    from machine import write_outputs

    good = tmp_path / "table.md"
    assert write_outputs("x.py", {good: "ok\n"})
    assert good.read_text() == "ok\n"
    assert not write_outputs("x.py", {tmp_path / "no" / "such" / "t.md": "lost\n"})
    err = capsys.readouterr().err
    assert err.startswith("x.py: cannot write ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_every_model_is_the_size_its_source_states(rows):
    from octodsl.models import parse_model

    models = {r["model"]["name"]: r["model"] for r in rows.values()}
    assert len(models) >= 25
    for name, model in models.items():
        built = parse_model(published.spec_of(model), name).params()
        assert published.stated_params_problem(model, built) is None


def test_a_wrongly_tied_model_is_refused(rows):
    model = rows["megatron-readme-h100-weak-1.7b"]["model"]
    # the README's 1.7B tied would be 1.48B: its untied output layer is 268M of the 1.74B
    assert "1.48B parameters as built" in published.stated_params_problem(model, 1.48e9)
    assert published.stated_params_problem(model, 1.74e9) is None
    for hostile in ("big", "xB", "-1B", "nanB", "", "1.7"):
        assert "not a size" in published.stated_params_problem({**model, "params": hostile}, 1e9)


def test_rows_of_the_same_work_are_paired_and_their_ratios_compared():
    def row(rid, work, metric, published_figure, simulated, seconds):
        return {
            "id": rid,
            "replica_work": work,
            "metric": metric,
            "published": published_figure,
            "simulated": simulated,
            "iteration_time": seconds,
        }

    results = [
        row("a", "w", "iteration_s", 10.0, 9.0, 9.0),
        # a throughput: half the published figure is twice the time (22 s against a's 10)
        row("b", "w", "tflops_per_gpu", 50.0, 100.0, 11.0),
        row("c", "other", "iteration_s", 5.0, 5.0, 5.0),
    ]
    (d,) = published.disagreements(results)
    assert (d["a"], d["b"]) == ("a", "b")
    assert d["published"] == pytest.approx(2.2) and d["simulated"] == pytest.approx(11 / 9)


def test_by_engine_groups_rows_by_the_software_their_source_ran():
    data = {"sources": {"a": {"engine": "X"}, "b": {"engine": "X"}, "c": {"engine": "Y"}}}
    results = [
        {"source": "a", "metric": "iteration_s", "published": 2.0, "iteration_time": 1.0},
        # a throughput 10% under the simulated one: measured 1.1 times the simulated seconds
        {
            "source": "b",
            "metric": "tflops_per_gpu",
            "published": 100.0,
            "simulated": 110.0,
            "iteration_time": 1.0,
        },
        {"source": "c", "metric": "iteration_s", "published": 0.5, "iteration_time": 1.0},
    ]
    x, y = published.by_engine(results, data)
    assert (x["engine"], x["sources"], x["rows"]) == ("X", ["a", "b"], 2)
    assert x["mean"] == pytest.approx(1.55) and x["least"] == pytest.approx(1.1)
    assert x["most"] == 2.0
    assert (y["engine"], y["rows"], y["mean"]) == ("Y", 1, 0.5)
