"""The whole-cluster search (`tune --gpus`) of issue 17: writes benchmarks/cluster.md, .json and
benchmarks/cluster_scaling.png.

    .venv/bin/python benchmarks/cluster.py [--paper-budget 150] [--budget 60] [--jobs 2]
        [--seed 0] [--sims 20] [--quick] [--parts PART ...]
        [-o benchmarks/cluster.md]
    .venv/bin/python benchmarks/cluster.py --from-json benchmarks/cluster.json  # tables again

`octodsl.tune.cluster.search` on H800s (analytical costs), the device's 80 GB per GPU (as the
CLI takes it), 8 GPUs per node, each model's own sequence length, recompute auto:
1. the paper's setting: 128 GPUs, nemotron-h-56b, nemotron-h-8b, jamba-v0.1 and llama3-70b,
   global batch 256 and 1024: the best configuration and plan, each baseline of the same run
   (Megatron-style with equal and time-balanced layers, the best classic schedule at the best
   configuration, the configuration search with classic schedules only), what was left out;
2. scale: nemotron-h-56b on 1024 and 8192 GPUs, global batch 1024: the search's wall time
   against its budget, and the simulator's time per plan at that scale (the Evaluator on the
   best plan and on the best Megatron-style plan);
3. scaling of nemotron-h-56b: strong (global batch 1024, 64 to 8192 GPUs), weak (one sequence
   per GPU) and against the global batch (256 to 4096 at 1024 GPUs), as a PNG;
4. wide: a 96-layer model on 384 GPUs (issue 30): GPT-175B (benchmarks/published/
   gpt-175b-v64k.yaml, MegaScale's) on A100s of 80 GB, global batch 1536, the others' budget:
   what the search screens and tunes, and the best plan against the Megatron-style recipe.
Each case (model, GPUs, global batch; one case may serve several parts) runs in its own
single-threaded process, `--jobs` at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import (  # noqa: E402
    add_jobs,
    check_outputs,
    command_line,
    commit,
    cpu_model,
    one_thread_each,
    table_head,
    write_outputs,
)

REPO = Path(__file__).resolve().parent.parent
PAPER_MODELS = ("nemotron-h-56b", "nemotron-h-8b", "jamba-v0.1", "llama3-70b")
HYBRIDS = ("nemotron-h-56b", "nemotron-h-8b", "jamba-v0.1")
PAPER_GPUS, PAPER_BATCHES = 128, (256, 1024)
SCALE_MODEL, SCALE_BATCH, SCALE_GPUS = "nemotron-h-56b", 1024, (1024, 8192)
CURVE_GPUS = tuple(64 << i for i in range(8))  # 64 ... 8192
CURVE_BATCHES, CURVE_BATCH_GPUS = (256, 512, 1024, 2048, 4096), 1024
DEVICE, GPUS_PER_NODE = "H800", 8
WIDE = ("benchmarks/published/gpt-175b-v64k.yaml", 384, 1536)
WIDE_DEVICE, WIDE_TUNED = "A100", 4
"""The wide case's device, and the configurations its search must tune (issue 30)."""
TARGET_HYBRID, TARGET_56B = 1.15, 1.3
MEGATRON = ("Megatron-style, equal layers", "Megatron-style, time-balanced")
CLASSIC_SAME = "best classic schedule, same configuration"
CLASSIC_SEARCH = "configuration search, classic only"
BASELINES = (*MEGATRON, CLASSIC_SAME, CLASSIC_SEARCH)
SHORT = {
    MEGATRON[0]: "Megatron equal",
    MEGATRON[1]: "Megatron time",
    CLASSIC_SAME: "classic, same config",
    CLASSIC_SEARCH: "classic-only search",
}
STATUSES = ("tuned", "screened", "infeasible", "dominated", "not screened")


PARTS = ("paper", "scale", "strong", "weak", "batch", "wide")


def cases(
    quick: bool, parts: tuple[str, ...] = PARTS
) -> dict[tuple[str, int, int, str], list[str]]:
    """(model, GPUs, global batch, PAPER or CURVE: its budget) -> the parts it serves, in the
    order they run (the paper's long cases first, so that the pool's two workers end together).
    A paper case that is also a curve's point runs again with the curves' budget, so that every
    point of a curve had the same."""
    if quick:
        paper = [(m, PAPER_GPUS, 256) for m in ("nemotron-h-8b", "nemotron-h-56b")]
        gpus, batches = (64, 1024, 8192), (256, 1024)
    else:
        paper = [(m, PAPER_GPUS, b) for m in PAPER_MODELS for b in PAPER_BATCHES]
        gpus, batches = CURVE_GPUS, CURVE_BATCHES
    out: dict[tuple[str, int, int, str], list[str]] = {}
    todo = (
        [("paper", k) for k in paper]
        + [("scale", (SCALE_MODEL, g, SCALE_BATCH)) for g in SCALE_GPUS]
        + [("strong", (SCALE_MODEL, g, SCALE_BATCH)) for g in gpus]
        + [("weak", (SCALE_MODEL, g, g)) for g in gpus]
        + [("batch", (SCALE_MODEL, CURVE_BATCH_GPUS, b)) for b in batches]
        + [("wide", WIDE)]
    )
    for part, key in todo:
        if part in parts:
            out.setdefault((*key, PAPER if part == "paper" else CURVE), []).append(part)
    return out


PAPER, CURVE = "paper", "curve"


def device_of(model: str) -> str:
    return WIDE_DEVICE if model == WIDE[0] else DEVICE


def run_case(model: str, gpus: int, global_batch: int, budget: float, seed: int, sims: int) -> dict:
    from octodsl.costs.devices import get_device
    from octodsl.sim import warm_up
    from octodsl.tune.cluster.report import to_json
    from octodsl.tune.cluster.search import NoConfigurationFits, search
    from octodsl.tune.cluster.space import Cluster

    out: dict = {"model": model, "gpus": gpus, "global_batch": global_batch, "budget": budget}
    device = device_of(model)
    t = time.perf_counter()
    warm_up()
    out["warm_up_seconds"] = time.perf_counter() - t
    cluster = Cluster(
        model,
        gpus,
        global_batch,
        device=device,
        gpus_per_node=GPUS_PER_NODE,
        memory=get_device(device).memory,
    )
    phases: dict[str, float] = {}
    t0 = time.perf_counter()

    def progress(what: str, best: float, left: float) -> None:
        # when each phase began: the Megatron-style recipe starts when the enumeration ends
        phases.setdefault(what.split(" ", 1)[0].rstrip(":"), time.perf_counter() - t0)

    try:
        result = search(cluster, budget=budget, seed=seed, progress=progress)
    except NoConfigurationFits as e:
        out.update(error="no configuration fits", note=str(e), wall=time.perf_counter() - t0)
        return out
    out["wall"] = time.perf_counter() - t0
    out.update(to_json(result, []))
    out["phases"] = phases
    out["candidates"] = len(result.candidates)
    out["enumerated"] = len(result.candidates) + sum(s.why == "infeasible" for s in result.skipped)
    out["evaluations"] = sum(c.tuned.evaluations for c in result.candidates if c.tuned)
    best = result.best
    megatron = [m for m in result.megatron if m.score is not None]
    out["simulator"] = {"best": _sim_time(best.problem, best.best.plan, sims)}  # type: ignore[union-attr]
    if megatron:
        m = min(megatron, key=lambda m: m.score.time)  # type: ignore[union-attr]
        problem = next(c.problem for c in result.candidates if c.config == m.config)
        out["simulator"]["megatron"] = _sim_time(problem, m.score.plan, sims)  # type: ignore[union-attr]
    return out


def _sim_time(problem, plan, sims: int) -> dict:
    """The Evaluator's seconds per simulation of `plan`: compiled afresh each time (a new
    placement) and again with the program of its placement reused (the tuner's common case)."""
    from octodsl.tune.pipeline.evaluate import Evaluator

    def timed(evaluate) -> float:
        t = time.perf_counter()
        evaluate(plan)
        return time.perf_counter() - t

    cold = [timed(Evaluator(problem)) for _ in range(sims)]
    evaluate = Evaluator(problem)
    evaluate(plan)
    warm = [timed(evaluate) for _ in range(sims)]
    return {
        "ops": sum(1 for _ in plan.ops()),
        "devices": plan.devices,
        "cold_median": statistics.median(cold),
        "warm_median": statistics.median(warm),
        "sims": sims,
    }


# ----- the report, from the results alone -----


def _tok(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _config(b: dict) -> str:
    """'tp8 pp4 dp4, 64 x 1, z1' of a row of to_json ('dp16 ep8' at ep > 1)."""
    ep = f" ep{b['ep']}" if b.get("ep", 1) > 1 else ""
    return (
        f"tp{b['tp']} pp{b['pp']} dp{b['dp']}{ep}, {b['microbatches']} x "
        f"{b['microbatch_size']}, z{b['zero']}"
    )


def megatron_best(r: dict) -> dict | None:
    """The better of the two Megatron-style baselines (None: neither fits)."""
    ms = [r["baselines"].get(m) for m in MEGATRON]
    return max((m for m in ms if m), key=lambda m: m["tokens_per_gpu_per_s"], default=None)


def _fail(r: dict) -> str:
    return f"{r['error']}: {r['note']}"


def paper_tables(results: list[dict]) -> list[str]:
    head = [
        "model",
        "batch",
        "best: tp pp dp (ep), M x mbs, zero",
        "recompute",
        "plan",
        "iteration ms",
        "tok/GPU/s",
        "eff.",
    ] + [c for b in BASELINES for c in (SHORT[b], "x")]
    lines = table_head(head)
    for r in results:
        cells = [r["model"], str(r["global_batch"])]
        if "error" in r:
            lines.append("| " + " | ".join(cells + [_fail(r)] + [""] * (len(head) - 3)) + " |")
            continue
        b = r["best"]
        cells += [
            _config(b),
            b["recompute"],
            b["plan"],
            f"{b['iteration_time'] * 1e3:,.0f}",
            _tok(b["tokens_per_gpu_per_s"]),
            f"{b['efficiency']:.3f}",
        ]
        for name in BASELINES:
            x = r["baselines"].get(name)
            cells += (
                ["none fits", ""]
                if x is None
                else [_tok(x["tokens_per_gpu_per_s"]), f"{x['speedup']:.3f}x"]
            )
        lines.append("| " + " | ".join(cells) + " |")
    head2 = ["model", "batch"] + [SHORT[b] for b in BASELINES]
    lines += [
        "",
        "The baselines' configurations and plans:",
        "",
        *table_head(head2),
    ]
    for r in results:
        if "error" in r:
            continue
        cells = [r["model"], str(r["global_batch"])]
        for name in BASELINES:
            x = r["baselines"].get(name)
            cells.append(
                "none fits"
                if x is None
                else f"{_config(x)}; {x['plan']}"
                + ("" if x["recompute"] == "none" else f", recompute {x['recompute']}")
            )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def search_table(results: list[dict]) -> list[str]:
    head = [
        "model",
        "GPUs",
        "batch",
        "enumerated",
        *STATUSES,
        "tuner plans",
        "enumerate s",
        "screen from s",
        "tune from s",
        "search s",
        "budget s",
        "within",
    ]
    lines = table_head(head)
    for r in results:
        cells = [r["model"], str(r["gpus"]), str(r["global_batch"])]
        if "error" in r:
            lines.append("| " + " | ".join(cells + [_fail(r)] + [""] * (len(head) - 4)) + " |")
            continue
        p = r["phases"]
        seconds = r["search"]["seconds"]
        cells += [str(r["enumerated"])] + [str(r["counts"].get(s, 0)) for s in STATUSES]
        cells += [
            str(r["evaluations"]),
            _s(p.get("Megatron-style")),
            _s(p.get("screen")),
            _s(p.get("tune")),
            f"{seconds:.1f}",
            f"{r['budget']:.0f}",
            "yes" if seconds <= r["budget"] else f"no, +{seconds - r['budget']:.1f} s",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def wide_lines(wide: list[dict], verdict: bool = False) -> list[str]:
    """What the wide case's search did and found (`verdict`: against issue 30's target)."""
    lines = []
    for r in wide:
        if "error" in r:
            lines.append(f"- {r['model']} on {r['gpus']} GPUs: {_fail(r)}")
            continue
        c = r["counts"]
        tuned, screened = c.get("tuned", 0), c.get("screened", 0)
        left = r["candidates"]
        if verdict:
            lines.append(
                f"- wide ({r['gpus']} GPUs, {left} configurations the memory bound leaves): "
                f"estimated all {left}, {tuned + screened} screened, {tuned} tuned; target "
                f">= {WIDE_TUNED} tuned: " + ("met" if tuned >= WIDE_TUNED else "not met")
            )
            continue
        b, m = r["best"], megatron_best(r)
        lines.append(
            f"Of the {left} configurations the memory bound leaves, every one is estimated "
            f"(the screening order, docs/cluster.md), {tuned + screened} had their classic "
            f"plans simulated and {tuned} were tuned; {c.get('dominated', 0)} are dominated by "
            f"their lower bound, {c.get('not screened', 0)} were left for the budget. The best "
            f"plan: {_config(b)}, {b['plan']}, {b['iteration_time']:,.1f} s per iteration, "
            f"{_tok(b['tokens_per_gpu_per_s'])} tokens per GPU per second"
            + (
                ""
                if m is None
                else f", {m['speedup']:.3f}x the better Megatron-style plan ({_config(m)}; "
                f"{m['plan']}, {m['iteration_time']:,.1f} s)"
            )
            + "."
        )
    return lines


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def simulator_table(results: list[dict]) -> list[str]:
    head = [
        "GPUs",
        "batch",
        "plan",
        "configuration",
        "pipeline devices",
        "ops",
        "ms per simulation, compiled afresh",
        "ms, program reused",
    ]
    lines = table_head(head)
    for r in results:
        if "error" in r:
            lines.append(f"| {r['gpus']} | {r['global_batch']} | {_fail(r)} |" + " |" * 5)
            continue
        for which, row in (("best", r["best"]), ("best Megatron-style", megatron_best(r))):
            s = r["simulator"].get("best" if which == "best" else "megatron")
            if s is None or row is None:
                continue
            lines.append(
                f"| {r['gpus']} | {r['global_batch']} | {which} ({row['plan']}) | "
                f"{_config(row)} | {s['devices']} | {s['ops']:,} | "
                f"{s['cold_median'] * 1e3:,.1f} | {s['warm_median'] * 1e3:,.1f} |"
            )
    return lines


def curve_table(results: list[dict]) -> list[str]:
    head = [
        "GPUs",
        "batch",
        "best: tp pp dp (ep), M x mbs, zero",
        "recompute",
        "tok/GPU/s",
        "Megatron-style best",
        "tok/GPU/s",
        "x",
        "tuned",
        "not screened",
        "search s",
        "budget s",
    ]
    lines = table_head(head)
    for r in results:
        cells = [str(r["gpus"]), str(r["global_batch"])]
        if "error" in r:
            lines.append("| " + " | ".join(cells + [_fail(r)] + [""] * (len(head) - 3)) + " |")
            continue
        b, m = r["best"], megatron_best(r)
        cells += [_config(b), b["recompute"], _tok(b["tokens_per_gpu_per_s"])]
        cells += (
            ["none fits", "-", "-"]
            if m is None
            else [
                f"{_config(m)}; {m['plan']}",
                _tok(m["tokens_per_gpu_per_s"]),
                f"{m['speedup']:.3f}x",
            ]
        )
        cells += [
            str(r["counts"].get("tuned", 0)),
            str(r["counts"].get("not screened", 0)),
            f"{r['search']['seconds']:.1f}",
            f"{r['budget']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def targets(paper: list[dict], everything: list[dict], scale: list[dict]) -> list[str]:
    ok = [r for r in paper if "error" not in r]
    lines = []
    for r in paper:
        what = f"{r['model']}, batch {r['global_batch']}"
        if "error" in r:
            lines.append(f"- {what}: {_fail(r)}")
            continue
        m = megatron_best(r)
        x = None if m is None else m["speedup"]
        need = (
            TARGET_56B
            if r["model"] == "nemotron-h-56b"
            else TARGET_HYBRID
            if r["model"] in HYBRIDS
            else None
        )
        verdict = (
            "no Megatron-style plan fits"
            if x is None
            else f"{x:.3f}x over the better Megatron-style baseline ({m['plan']})"
        )
        if need is not None and x is not None:
            verdict += f", target >= {need}x: " + ("met" if x >= need else "not met")
        elif need is None:
            verdict += " (not a hybrid: no target)"
        lines.append(f"- {what}: {verdict}")
    hybrids = [r for r in ok if r["model"] in HYBRIDS and megatron_best(r)]
    met = [r for r in hybrids if megatron_best(r)["speedup"] >= TARGET_HYBRID]  # type: ignore[index]
    big = [r for r in ok if r["model"] == "nemotron-h-56b" and megatron_best(r)]
    big_met = [r for r in big if megatron_best(r)["speedup"] >= TARGET_56B]  # type: ignore[index]
    lines += [
        f"- >= {TARGET_HYBRID}x over the Megatron-style baseline on every hybrid: "
        + ("met" if len(met) == len(hybrids) and hybrids else "not met")
        + f" ({len(met)} of {len(hybrids)} hybrid cases)",
        f"- >= {TARGET_56B}x on nemotron-h-56b: "
        + ("met" if len(big_met) == len(big) and big else "not met")
        + f" ({len(big_met)} of {len(big)})",
    ]
    for label, rs in (
        ("paper cases", ok),
        ("all cases of this benchmark", [r for r in everything if "error" not in r]),
    ):
        slower = [
            (r, name, x["speedup"])
            for r in rs
            for name, x in r["baselines"].items()
            if x is not None and x["speedup"] < 1 - 1e-9
        ]
        worst = min((x["speedup"] for r in rs for x in r["baselines"].values() if x), default=None)
        lines.append(
            f"- never slower than any baseline ({label}, {len(rs)}): "
            + (
                "met"
                if not slower
                else "not met: "
                + "; ".join(
                    f"{r['model']} {r['gpus']} GPUs batch {r['global_batch']} vs {n} {x:.3f}x"
                    for r, n, x in slower
                )
            )
            + ("" if worst is None else f"; the smallest speed-up over a baseline {worst:.3f}x")
        )
    for r in scale:
        if "error" in r:
            lines.append(f"- {r['gpus']} GPUs: {_fail(r)}")
            continue
        s, enum = r["search"]["seconds"], r["phases"].get("Megatron-style", 0.0)
        lines.append(
            f"- search at {r['gpus']} GPUs within its budget of {r['budget']:.0f} s: "
            + ("met" if s <= r["budget"] else "not met")
            + f" ({s:.1f} s; of it the enumeration {enum:.1f} s, the Megatron-style "
            f"recipe {r['phases'].get('screen', enum) - enum:.1f} s (the enumeration is "
            f"not cut short by the budget, the recipe after its first depth is); "
            f"{r['enumerated']:,} configurations enumerated, "
            f"{r['candidates']:,} feasible)"
        )
    return lines


def _geo(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    return (
        f"geometric mean {statistics.geometric_mean(xs):.3f}x, min {min(xs):.3f}x, "
        f"max {max(xs):.3f}x"
    )


def findings(paper: list[dict], curves: dict[str, list[dict]]) -> list[str]:
    """Where the speed-up comes from, and the points a budget may have held back."""
    ok = [r for r in paper if "error" not in r]
    lines = []
    for name in (CLASSIC_SEARCH, CLASSIC_SAME):
        xs = [r["baselines"][name]["speedup"] for r in ok if r["baselines"].get(name)]
        lines.append(f"- paper cases, speed-up over the {name}: {_geo(xs)} ({len(xs)} cases)")
    tps = sorted({r["best"]["tp"] for r in ok})
    meg = sorted({m["tp"] for r in ok if (m := megatron_best(r))})
    split = [
        megatron_best(r)["speedup"] / r["baselines"][CLASSIC_SEARCH]["speedup"]  # type: ignore[index]
        for r in ok
        if megatron_best(r) and r["baselines"].get(CLASSIC_SEARCH)
    ]
    lines += [
        "- the best configurations' tp in the paper cases: "
        + ", ".join(f"tp {t} in {sum(r['best']['tp'] == t for r in ok)}" for t in tps)
        + f"; the Megatron-style recipe's: tp {', '.join(map(str, meg))}",
        "- of the speed-up over the better Megatron-style baseline, the configuration search with "
        f"classic schedules only makes {_geo(split)}, the pipeline tuner the "
        "rest (the first line; paper cases)",
    ]
    for part, rs in curves.items():
        done = [r for r in rs if "error" not in r]
        for a, b in zip(done, done[1:], strict=False):
            ta, tb = a["best"]["tokens_per_gpu_per_s"], b["best"]["tokens_per_gpu_per_s"]
            if part == "batch" and tb < ta:
                lines.append(
                    f"- batch curve: {tb:,.0f} tok/GPU/s at batch {b['global_batch']} "
                    f"is below {ta:,.0f} at {a['global_batch']}; that search tuned "
                    f"{b['counts'].get('tuned', 0)} and left "
                    f"{b['counts'].get('not screened', 0)} of its {b['candidates']} "
                    f"feasible configurations not screened in {b['budget']:.0f} s "
                    f"(the screen began at {b['phases'].get('screen', 0):.1f} s)"
                )
    return lines


def plot(curves: dict[str, list[dict]]) -> bytes:
    """The scaling curves as a PNG."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {
        "strong": f"strong scaling (global batch {SCALE_BATCH})",
        "weak": "weak scaling (global batch = GPUs)",
        "batch": f"global batch at {CURVE_BATCH_GPUS} GPUs",
    }
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (part, rs) in zip(axes, curves.items(), strict=True):
        xs = [r["global_batch"] if part == "batch" else r["gpus"] for r in rs]
        best = [r["best"]["tokens_per_gpu_per_s"] if "error" not in r else None for r in rs]
        meg = [
            None
            if "error" in r or megatron_best(r) is None
            else megatron_best(r)["tokens_per_gpu_per_s"]
            for r in rs
        ]  # type: ignore[index]
        for ys, label, style in (
            (best, "best plan (tune --gpus)", "o-"),
            (meg, "Megatron-style baseline (better of equal / time)", "s--"),
        ):
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=label)
        for x, r in zip(xs, rs, strict=True):
            if "error" in r:
                ax.axvline(x, color="grey", lw=0.8, ls=":")
                ax.annotate(
                    "no configuration fits",
                    (x, 0.02),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize=7,
                    color="grey",
                    ha="right",
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("global batch (sequences)" if part == "batch" else "GPUs")
        ax.set_ylabel("tokens / GPU / s")
        ax.set_title(titles[part], fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle(
        f"{SCALE_MODEL} on {DEVICE}s (analytical costs, 80 GB, {GPUS_PER_NODE} per node), "
        "simulated",
        fontsize=11,
    )
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return png.getvalue()


def report(data: dict, md: Path, png: Path, remade: str = "") -> str:
    """The md page and the PNG; `remade`: the command that re-made them from the JSON."""
    results = data["results"]

    def part(name: str) -> list[dict]:
        return [r for r in results if name in r["parts"]]

    curves = {
        p: sorted(part(p), key=lambda r: (r["gpus"], r["global_batch"]))
        for p in ("strong", "weak", "batch")
    }
    image = plot(curves)
    paper = part("paper")
    scale = sorted(part("scale"), key=lambda r: r["gpus"])
    wide = part("wide")
    m = data["meta"]
    text = [
        "# Whole-cluster search (`tune --gpus`) benchmark",
        "",
        f"Made by `{m['command']}` on {m['cpu']} ({m['cores']} cores, shared; each case in one "
        f"single-threaded process, {m['jobs']} at once), commit {m['commit']}, {m['date']}; "
        f"{m['seconds']:.0f} s in all; load average {m['load_start']:.1f} when it started, "
        f"{m['load_end']:.1f} when it ended (budgets are wall time: on a busier machine the "
        f"search simulates fewer plans)."
        + (f" This page and the plot were re-made from the JSON by `{remade}`." if remade else ""),
        "",
        f"`octodsl.tune.cluster.search` (what `octodsl tune --gpus N --global-batch B` runs) on "
        f"{DEVICE}s with analytical costs, the device's {m['memory'] / 1e9:.0f} GB per GPU (as the "
        f"CLI takes it), {GPUS_PER_NODE} GPUs per node, each model's own sequence length "
        f"(4096), recompute auto, seed {m['seed']}; budgets {m['paper_budget']:.0f} s for the "
        f"paper's cases, {m['budget']:.0f} s for the others. Tokens per GPU per second: the "
        f"global batch's tokens over the iteration time and all the GPUs. `x`: the best plan's "
        f"tokens per GPU per second over the baseline's. `eff.`: the configuration's lower bound "
        f"over the best plan's iteration. Configurations `M x mbs`: micro-batches per pipeline x "
        f"sequences per micro-batch.",
        "",
        f"## The paper's setting: {PAPER_GPUS} GPUs",
        "",
        *paper_tables(paper),
        "",
        "## What each search did",
        "",
        "Configurations enumerated, then by status (tuned; screened with the classic schedules "
        "but not tuned; infeasible: no plan fits in memory; dominated: its lower bound no "
        "shorter than the best plan's iteration, so it cannot win; not screened: the budget ran "
        "out before it, though its bound says it might have won). `tuner plans`: plans the pipeline tuner simulated. The phase columns are "
        "seconds since the search began when the Megatron-style recipe (the enumeration's end), "
        "the screen and the tuner began; `search s` is the search's own wall time (the process's "
        "one-off numba warm-up before it not counted: `warm_up_seconds` in the JSON).",
        "",
        *search_table(sorted(results, key=lambda r: (r["model"], r["gpus"], r["global_batch"]))),
        "",
        f"## Scale: {SCALE_MODEL} on {' and '.join(map(str, SCALE_GPUS))} GPUs, global batch "
        f"{SCALE_BATCH}",
        "",
        *search_table(scale),
        "",
        f"The simulator's time per plan (the Evaluator, median of {m['sims']} simulations each): "
        f"compiled afresh every time (a plan with a new placement), and with its placement's "
        f"program reused (a partition or schedule move, the tuner's common case). The simulator "
        f"runs one pipeline of `pipeline devices` (tp and dp enter as the costs of its ops and "
        f"collectives), so its time follows the plan's ops, not the GPU count.",
        "",
        *simulator_table(scale),
        "",
        f"## Scaling of {SCALE_MODEL}",
        "",
        f"![scaling]({png.name})",
        "",
        f"Strong scaling (global batch {SCALE_BATCH}):",
        "",
        *curve_table(curves["strong"]),
        "",
        "Weak scaling (global batch = GPUs, one sequence per GPU):",
        "",
        *curve_table(curves["weak"]),
        "",
        f"Against the global batch at {CURVE_BATCH_GPUS} GPUs:",
        "",
        *curve_table(curves["batch"]),
        "",
        f"## Wide: a 96-layer model on {WIDE[1]} GPUs",
        "",
        f"GPT-175B as MegaScale ran it ({WIDE[0]}: 96 layers, vocabulary 64,000) on "
        f"{WIDE[1]} {WIDE_DEVICE}s of 80 GB, global batch {WIDE[2]} sequences of 2048 "
        f"tokens, budget {m['budget']:.0f} s (issue 30: the search screens every configuration "
        "its bounds do not rule out and tunes at least the best four).",
        "",
        *search_table(wide),
        "",
        *wide_lines(wide),
        "",
        "## Against the targets",
        "",
        *targets(paper, results, scale),
        *wide_lines(wide, verdict=True),
        "",
        "## Notes",
        "",
        *findings(paper, curves),
        "",
    ]
    if not write_outputs("cluster.py", {md: "\n".join(text), png: image}):
        raise SystemExit(2)
    return "\n".join(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paper-budget", type=float, default=150.0, help="seconds per paper case")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds per other case")
    ap.add_argument("--seed", type=int, default=0)
    add_jobs(ap, 1)
    ap.add_argument("--sims", type=int, default=20, help="simulations timed per plan")
    ap.add_argument("--quick", action="store_true", help="a few cases of each part (a smoke run)")
    ap.add_argument(
        "--parts", nargs="+", choices=PARTS, default=PARTS, help="the parts to run (default all)"
    )
    ap.add_argument("--from-json", type=Path, help="only re-make the md and the PNG from this")
    ap.add_argument("-o", "--output", type=Path, default=REPO / "benchmarks" / "cluster.md")
    args = ap.parse_args()
    md, png = args.output, args.output.with_name(args.output.stem + "_scaling.png")
    written = [md, png] if args.from_json else [md, md.with_suffix(".json"), png]
    if not check_outputs("cluster.py", written, inputs=[args.from_json] if args.from_json else []):
        return 2
    if args.from_json:
        again = command_line(".venv/bin/python benchmarks/cluster.py")
        print(
            report(
                json.loads(args.from_json.read_text()), md, png, f"{again}` at commit `{commit()}"
            )
        )
        return 0
    one_thread_each()
    todo = cases(args.quick, tuple(args.parts))
    t0, load = time.perf_counter(), os.getloadavg()[0]
    results = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            key: pool.submit(
                run_case,
                *key[:3],
                args.paper_budget if key[3] == PAPER else args.budget,
                args.seed,
                args.sims,
            )
            for key in todo
        }
        for key, f in futures.items():
            r = f.result() | {"parts": todo[key]}
            results.append(r)
            print(
                *key[:3],
                r.get("error")
                or f"{r['best']['tokens_per_gpu_per_s']:,.0f} tok/GPU/s, "
                f"search {r['search']['seconds']:.1f} s",
                flush=True,
            )
    from octodsl.costs.devices import get_device

    meta = {
        "command": command_line(".venv/bin/python benchmarks/cluster.py"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "jobs": args.jobs,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.perf_counter() - t0,
        "load_start": load,
        "load_end": os.getloadavg()[0],
        "seed": args.seed,
        "sims": args.sims,
        "paper_budget": args.paper_budget,
        "budget": args.budget,
        "memory": get_device(DEVICE).memory,
    }
    data = {"meta": meta, "results": results}
    if not write_outputs("cluster.py", {md.with_suffix(".json"): json.dumps(data, indent=1)}):
        return 2
    print(report(data, md, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
