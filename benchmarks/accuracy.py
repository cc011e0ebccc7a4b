"""Simulator accuracy against real runs of the executor on this machine, before and after
calibration (issue 7).

    .venv/bin/python benchmarks/accuracy.py [--models nemotron-h-tiny,jamba-tiny] [--steps 4]
        [--out benchmarks/accuracy.md] [--workdir DIR]

Per model:
1. profile it (`octodsl profile`: one thread, medians of 5);
2. calibrate (what `octodsl calibrate --model M --ranks 2,4` does): run the calibration plans
   (1F1B, ZB-H1, ZB-V on 2 and 4 processes, 2 x processes micro-batches) through the executor
   with the deepspeed launcher and fit the calibrated profile;
3. run the evaluation plans, which calibration never ran: classic schedules (GPipe, 1F1B with
   other micro-batch counts, ZB-H2, interleaved, DualPipeV, a 1F1B cut by parameter counts as
   DeepSpeed does) and plans tuned by `octodsl tune`'s search against the calibrated profile,
   on 2 and 4 processes;
4. simulate each evaluation plan with the plain profile (and the built-in `loopback` link) and
   with the calibrated profile, and compare with the measured run (octodsl.calibrate.compare):
   iteration time (median over the timed steps of step start to next step start) and peak
   memory per rank (parameters, gradients and optimizer state as allocated, plus activations as
   the profiler counts them: saved-tensor hooks and the W state, sampled after every op of the
   first step).

Writes the markdown report (--out) and the raw numbers beside it (.json). Run it on a quiet
machine: the report states the load average and the other busy processes before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from octodsl.calibrate.compare import compare  # noqa: E402
from octodsl.calibrate.fit import Run, fit  # noqa: E402
from octodsl.calibrate.measured import read_trace  # noqa: E402
from octodsl.calibrate.plans import calibration_plans  # noqa: E402
from octodsl.calibrate.runner import run_plans  # noqa: E402
from octodsl.costs.devices import get_link  # noqa: E402
from octodsl.costs.profile import read_profile, write_profile  # noqa: E402
from octodsl.costs.profiler import profile_model  # noqa: E402
from octodsl.gen import generate_text, render_plan  # noqa: E402
from octodsl.lang import parse_plan  # noqa: E402
from octodsl.models import load_model  # noqa: E402
from octodsl.plan import Header  # noqa: E402
from octodsl.sim import SimCosts  # noqa: E402

RANKS = (2, 4)

# (processes, schedule, micro-batches, partition, chunks): classic evaluation plans
CLASSIC = [
    (2, "gpipe", 4, "time", None),
    (2, "1f1b", 8, "time", None),
    (2, "dualpipev", 4, "time", None),
    (4, "1f1b", 4, "parameters", None),
    (4, "zb-h2", 8, "time", None),
    (4, "interleaved", 8, "time", 2),
]
TUNED = [(2, 8), (4, 8)]
"""(processes, micro-batches) of the tuned evaluation plans."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine_load() -> dict:
    load = os.getloadavg()
    ps = subprocess.run(["ps", "-eo", "pcpu,pid,args", "--sort=-pcpu"], capture_output=True,
                        text=True).stdout.splitlines()[1:]
    me = {os.getpid(), os.getppid()}
    busy = []
    for line in ps:
        parts = line.split(None, 2)
        if len(parts) == 3 and float(parts[0]) >= 5 and int(parts[1]) not in me:
            busy.append(f"{parts[0]}% {parts[2][:90]}")
    return {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg": [round(x, 2) for x in load],
            "busy": busy[:8]}


def tuned_plan(model: str, profile_path: Path, base_path: Path, processes: int,
               microbatches: int) -> str:
    """The tuner's search (octodsl.tune.loop) against the calibrated profile, from its own
    starts and the profile-balanced 1F1B."""
    from octodsl.tune.loop import tune
    from octodsl.tune.problem import Problem

    prof = read_profile(profile_path)
    table = prof.cost_table(profile_path)
    spec = prof.model
    shape = {"microbatch_size": spec.microbatch_size, "seq_len": spec.seq_len}
    header = Header(name=f"tuned-p{processes}-m{microbatches}", devices=processes,
                    microbatches=microbatches, model=model, **shape)
    problem = Problem(table, header, table.calibration.link)
    start = parse_plan(generate_text("1f1b", processes, microbatches, None, model, "time",
                                     profile=str(base_path), **shape))
    best = tune(problem, budget=30.0, seed=0, starts=[replace(start, header=header)]).best
    return render_plan(replace(best.plan, header=header),
                       title=f"Tuned by octodsl's tuner against {profile_path.name} "
                             f"(simulated {best.time:.3f} s).")


def evaluate(model: str, work: Path, steps: int, shape: tuple[int, int] | None) -> dict:
    spec = load_model(model).with_shape(*(shape or (None, None)))
    work.mkdir(parents=True, exist_ok=True)
    log(f"{model}: profiling")
    base = profile_model(spec, "cpu", threads=1, warmup=2, repeats=5)
    base_path = work / "base.profile.json"
    write_profile(base, base_path)

    log(f"{model}: calibration runs")
    shape = {"microbatch_size": spec.microbatch_size, "seq_len": spec.seq_len}
    plans = calibration_plans(model, str(base_path), list(RANKS), shape=shape)
    runs, probe, fitted_on = [], [], []
    cal_loads: dict[str, float | None] = {}
    for p in RANKS:
        mine = [(name, text) for q, name, text in plans if q == p]
        launch = run_plans(spec, mine, p, work, steps=steps,
                           progress=lambda e, f: log(f"  {e} {f}") if e in ("run", "launch") else None)
        probe = probe or launch.link
        for r in launch.runs:
            text = dict(mine)[r.name]
            runs.append(Run(parse_plan(text, r.name), read_trace(r.trace), r.name))
            fitted_on.append(r.name)
            cal_loads[r.name] = r.other_load
    log(f"{model}: fitting")
    cal = fit(base.cost_table(base_path), runs, probe=probe,
              source=f"{len(runs)} calibration plans on {RANKS} processes, {steps} steps each")
    cal_path = work / "calibrated.profile.json"
    write_profile(base.model_copy(update={"calibration": cal}), cal_path)

    log(f"{model}: evaluation plans")
    evals: dict[int, list[tuple[str, str, str]]] = {p: [] for p in RANKS}
    for p, sched, m, part, chunks in CLASSIC:
        text = generate_text(sched, p, m, chunks, model, part, profile=str(base_path), **shape)
        name = f"{sched}-p{p}-m{m}" + ("-params" if part == "parameters" else "")
        evals[p].append((name, text, "classic"))
    for p, m in TUNED:
        log(f"  tuning p{p} m{m}")
        evals[p].append((f"tuned-p{p}-m{m}", tuned_plan(model, cal_path, base_path, p, m), "tuned"))
    rows = []
    base_table = base.cost_table(base_path)
    cal_table = read_profile(cal_path).cost_table(cal_path)
    loopback = get_link("loopback")
    for p in RANKS:
        launch = run_plans(spec, [(n, t) for n, t, _ in evals[p]], p, work, steps=steps,
                           link_probe=False,
                           progress=lambda e, f: log(f"  {e} {f}") if e in ("run", "launch") else None)
        for (name, text, kind), r in zip(evals[p], launch.runs):
            plan = parse_plan(text, name)
            (work / f"{name}.octo").write_text(text)
            trace = read_trace(r.trace)
            before = compare(plan, SimCosts.from_table(base_table, plan), loopback, trace)
            after = compare(plan, SimCosts.from_table(cal_table, plan), cal_table.calibration.link,
                            read_trace(r.trace))
            periods = [s.period for s in trace.timed if s.period is not None]
            rows.append({
                "model": model, "plan": name, "kind": kind, "processes": p,
                "microbatches": plan.microbatches, "measured": after.iteration.measured,
                "spread": (max(periods) - min(periods)) / statistics.median(periods) if periods else None,
                "before": before.iteration.simulated, "before_error": before.iteration.error,
                "after": after.iteration.simulated, "after_error": after.iteration.error,
                "memory_before": [m.error for m in before.peak or []],
                "memory_after": [m.error for m in after.peak or []],
                "peak_measured": [m.measured for m in after.peak or []],
                "other_load": r.other_load,
            })
            log(f"  {name}: measured {rows[-1]['measured']:.3f} s, before {before.iteration.error:+.1%}, "
                f"after {after.iteration.error:+.1%}")
    return {"model": model, "calibration": json.loads(cal.model_dump_json()), "fitted_on": fitted_on,
            "calibration_load": cal_loads, "rows": rows}


def kendall(a: list[float], b: list[float]) -> float:
    n, s = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            s += (1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1 if (a[i] - a[j]) * (b[i] - b[j]) < 0 else 0)
    return s / (n * (n - 1) / 2) if n > 1 else 1.0


def ranking(rows: list[dict], key: str) -> dict:
    meas = [r["measured"] for r in rows]
    pred = [r[key] for r in rows]
    order_m = sorted(range(len(rows)), key=lambda i: meas[i])
    order_p = sorted(range(len(rows)), key=lambda i: pred[i])
    return {"same": order_m == order_p, "tau": kendall(meas, pred),
            "measured_order": [rows[i]["plan"] for i in order_m],
            "predicted_order": [rows[i]["plan"] for i in order_p]}


def report(results: list[dict], loads: list[dict], steps: int, seconds: float, command: str) -> str:
    rows = [r for res in results for r in res["rows"]]
    out = ["# Simulator accuracy against real runs (issue 7)", "",
           f"Command: `{command}` ({seconds / 60:.1f} min).", "",
           "Machine: " + _machine() + f". Each plan ran {steps} training steps through the executor "
           "(deepspeed launcher, gloo, one thread per process); the first step is not timed. "
           "Measured iteration = median over the timed steps of step start to next step start "
           "(optimizer step included). Error = (simulated - measured) / measured.", "",
           "Load while it ran (load average 1/5/15 min; other processes above 5% CPU):", ""]
    for ld in loads:
        out.append(f"- {ld['label']} {ld['time']}: load {ld['loadavg']}; "
                   + ("; ".join(ld["busy"]) if ld["busy"] else "no other busy process"))
    out += ["", "Other load = CPU cores used by processes outside the benchmark while the plan ran "
            "(from /proc); the machine has 2. Step spread = (slowest - fastest) / median of the "
            "timed steps' iteration times.", ""]
    out += ["", "**Before**: the plain profile and the built-in `loopback` link. **After**: the "
            "profile calibrated on the calibration plans only (`octodsl calibrate`); none of the "
            "plans below was run by calibration.", ""]
    out += ["| model | plan | kind | proc. | m | other load | measured s | step spread | before s | "
            "before err | after s | after err | memory err before (mean/worst rank) | memory err after "
            "(mean/worst rank) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mb, ma = [abs(x) for x in r["memory_before"]], [abs(x) for x in r["memory_after"]]
        out.append(f"| {r['model']} | {r['plan']} | {r['kind']} | {r['processes']} | {r['microbatches']} "
                   f"| {_cores(r['other_load'])} | {r['measured']:.3f} | {_pct(r['spread'])} | {r['before']:.3f} | {r['before_error']:+.1%} "
                   f"| {r['after']:.3f} | {r['after_error']:+.1%} "
                   f"| {_mem(mb)} | {_mem(ma)} |")
    out.append("")

    def summary(sel, label):
        tb = [abs(r["before_error"]) for r in sel]
        ta = [abs(r["after_error"]) for r in sel]
        mb = [abs(x) for r in sel for x in r["memory_before"]]
        ma = [abs(x) for r in sel for x in r["memory_after"]]
        worst = max(sel, key=lambda r: abs(r["after_error"]))
        return (f"| {label} | {len(sel)} | {statistics.mean(tb):.1%} | {max(tb):.1%} | "
                f"{statistics.mean(ta):.1%} | {max(ta):.1%} ({worst['plan']}) | "
                f"{statistics.mean(mb):.1%} | {max(mb):.1%} | {statistics.mean(ma):.1%} | {max(ma):.1%} |")

    out += ["| plans | n | time MAE before | worst before | time MAE after | worst after | "
            "memory MAE before | worst before | memory MAE after | worst after |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    out.append(summary(rows, "all"))
    for res in results:
        out.append(summary(res["rows"], res["model"]))
    for p in RANKS:
        sel = [r for r in rows if r["processes"] == p]
        if sel:
            out.append(summary(sel, f"{p} processes"))
    out += ["", "Memory errors are per rank (peak of that rank); MAE over all ranks of all plans.", "",
            "## Ranking", "",
            "Plans ordered by iteration time, measured vs predicted after calibration (Kendall tau "
            "1 = same order):", ""]
    for res in results:
        rk = ranking(res["rows"], "after")
        rb = ranking(res["rows"], "before")
        out.append(f"- {res['model']}, all plans: {'same order' if rk['same'] else 'order differs'} "
                   f"(tau {rk['tau']:.2f}; before calibration tau {rb['tau']:.2f}). Measured: "
                   f"{' < '.join(rk['measured_order'])}. Predicted: {' < '.join(rk['predicted_order'])}.")
        groups: dict[tuple, list] = {}
        for r in res["rows"]:
            groups.setdefault((r["processes"], r["microbatches"]), []).append(r)
        for (p, m), sel in sorted(groups.items()):
            if len(sel) > 1:
                g = ranking(sel, "after")
                out.append(f"  - {p} processes, {m} micro-batches: {'same order' if g['same'] else 'order differs'}"
                           f" ({' < '.join(g['measured_order'])} measured)")
    out += ["", "## Calibration", ""]
    for res in results:
        c = res["calibration"]
        out.append(f"- {res['model']}: fitted on {', '.join(res['fitted_on'])}. Link "
                   f"{c['link']['latency'] * 1e6:.0f} us + bytes / {c['link']['bandwidth'] / 1e9:.2f} GB/s; "
                   + ", ".join(f"{k} x{c['op_scale'][k]:.3f} + {c['op_overhead'][k] * 1e3:.2f} ms"
                               for k in ("F", "B", "W", "BW"))
                   + f"; cores {c['cores']}, contention {c['contention']:.2f}, overlap slowdown "
                   f"{c['overlap_slowdown']:.2f}; optimizer {c['update_per_param'] * 1e9:.2f} ns/parameter; "
                   f"step overhead {c['step_overhead'] * 1e3:.1f} ms; held for W "
                   + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in c.get("act_w_extra", {}).items())
                   + ". Fit on its own runs: "
                   + ", ".join(f"{r['plan']} {r['error']:+.1%} (other load {_cores(res['calibration_load'].get(r['plan']))})"
                               for r in c["fit"]["runs"]) + ".")
        for n in c["fit"].get("notes", []):
            out.append(f"  - note: {n}")
    return "\n".join(out) + "\n"


def _cores(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def _mem(errs: list[float]) -> str:
    return "-" if not errs else f"{statistics.mean(errs):.1%} / {max(errs):.1%}"


def _machine() -> str:
    name = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return f"{name}, {os.cpu_count()} cores, torch {torch.__version__} (CPU)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="nemotron-h-tiny,jamba-tiny:1x128",
                   help="models, each optionally NAME:BxS (micro-batch size x sequence length); "
                   "default nemotron-h-tiny at its 2 x 256, jamba-tiny at 1 x 128 (its Mamba1 "
                   "scan is slow on a CPU)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "accuracy.md"))
    p.add_argument("--workdir", help="keep plans, traces and profiles here (default: a temporary directory)")
    args = p.parse_args()
    command = "python benchmarks/accuracy.py" + "".join(
        f" {a}" for a in sys.argv[1:])
    work = Path(args.workdir or tempfile.mkdtemp(prefix="octodsl-accuracy-"))
    start = time.perf_counter()
    loads = [{"label": "before", **machine_load()}]
    results = []
    for item in args.models.split(","):
        model, _, shape = item.partition(":")
        dims = tuple(int(x) for x in shape.split("x")) if shape else None
        results.append(evaluate(model, work / Path(model).stem, args.steps, dims))
        loads.append({"label": f"after {model}", **machine_load()})
    seconds = time.perf_counter() - start
    text = report(results, loads, args.steps, seconds, command)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps({"results": results, "loads": loads}, indent=1))
    print(text)
    log(f"wrote {args.out}; traces in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
