"""Simulator accuracy against real runs of the executor on this machine, before and after
calibration (issue 7).

    .venv/bin/python benchmarks/accuracy.py [--models nemotron-h-tiny,jamba-tiny:1x128]
        [--allocator steady[,default]] [--steps 8] [--warmup 3] [--out benchmarks/accuracy.md]
        [--workdir DIR]

Per model:
1. profile it (`octodsl profile`: one thread, medians of 5 taken round-robin);
2. calibrate once (what `octodsl calibrate --model M --ranks 2,4` does: run the calibration
   plans, 1F1B, ZB-H1 and ZB-V on 2 and 4 processes with 2 x processes micro-batches, through
   the executor with the deepspeed launcher, and fit), only to tune plans against it with
   `octodsl tune`'s search;
3. per process count, one launch that runs the calibration plans again alternating with the
   evaluation plans, which calibration never ran: classic schedules (GPipe, ZB-H2, interleaved,
   DualPipeV, a 1F1B cut by parameter counts as DeepSpeed does) and the tuned plans. The
   calibration the errors are for is fitted on this launch's calibration runs alone: measured
   side by side with the evaluation plans, a slow spell of this shared machine (its speed drifts
   by up to 10-20% over minutes) falls on both alike;
4. simulate each evaluation plan with the plain profile (and the built-in `loopback` link) and
   with the calibrated profile, and compare with the measured run (octodsl.calibrate.compare):
   iteration time (median over the steps after the warm-up of step start to next step start) and peak
   memory per rank (parameters, gradients and optimizer state as allocated, plus activations as
   the profiler counts them: saved-tensor hooks and the W state, sampled after every op of the
   first step).

Allocator configurations (--allocator): `steady` runs every process (the profiler,
calibration and evaluation alike) with glibc told to keep freed memory (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_); `default` leaves glibc's defaults, under which it hands freed
activation memory back to the system between micro-batches and page-faults it back in later (about
0.45 ms per MiB here), which makes the same op 1.0x or 1.6x its profiled time from one step to
the next.

Writes the markdown report (--out) and the raw numbers beside it (.json); `--report-only` writes
the report again from those numbers. Run it on a quiet
machine: the report states the load average, the other busy processes before and after, and
the CPU other processes used while each plan ran.
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
from itertools import zip_longest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from octodsl.calibrate.compare import compare  # noqa: E402
from octodsl.calibrate.fit import fit  # noqa: E402
from octodsl.calibrate.measured import read_trace  # noqa: E402
from octodsl.calibrate.plans import calibration_plans  # noqa: E402
from octodsl.calibrate.runner import run_plans  # noqa: E402
from octodsl.costs.devices import get_link  # noqa: E402
from octodsl.costs.profile import read_profile, write_profile  # noqa: E402
from octodsl.gen import generate_text, render_plan  # noqa: E402
from octodsl.lang import parse_plan  # noqa: E402
from octodsl.models import load_model  # noqa: E402
from octodsl.plan import Header  # noqa: E402
from octodsl.sim import SimCosts  # noqa: E402

RANKS = (2, 4)
ALLOCATORS = {
    "steady": {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(16 << 30)},
    "default": {},
}

# (processes, schedule, micro-batches, partition, chunks): classic evaluation plans
CLASSIC = [
    (2, "gpipe", 4, "time", None),
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


def evaluate(model: str, work: Path, steps: int, warmup: int, shape: tuple[int, int] | None,
             env: dict) -> dict:
    spec = load_model(model).with_shape(*(shape or (None, None)))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the launched processes inherit it
    try:
        return _evaluate(model, spec, work, steps, warmup)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _profile(spec, work: Path, path: Path):
    """`octodsl profile` in a fresh process, so that it measures under the allocator the runs
    get: glibc reads its settings when a process starts, and under its defaults (this
    process's) an op that frees and reallocates large tensors takes 1x or 3.5x its time from
    one sample to the next (jamba-tiny's MoE W: 8 or 29 ms)."""
    spec_path = work / "model.json"
    spec_path.write_text(json.dumps(spec.model_dump()))
    cmd = [str(Path(sys.executable).parent / "octodsl"), "profile", "--model", str(spec_path),
           "--threads", "1", "--warmup", "2", "--repeats", "5", "-o", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        sys.exit(f"profiling failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return read_profile(path)


def _evaluate(model: str, spec, work: Path, steps: int, warmup: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    log(f"{model}: profiling")
    base_path = work / "base.profile.json"
    base = _profile(spec, work, base_path)
    table = base.cost_table(base_path)
    shape = {"microbatch_size": spec.microbatch_size, "seq_len": spec.seq_len}
    calibration = {p: [(name, text) for q, name, text in
                       calibration_plans(model, str(base_path), list(RANKS), shape=shape) if q == p]
                   for p in RANKS}
    say = lambda e, f: log(f"  {e} {f}") if e in ("run", "launch") else None  # noqa: E731

    # A first calibration, only to tune the tuned plans against.
    log(f"{model}: calibration runs for the tuner")
    runs, probe = [], []
    for p in RANKS:
        launch = run_plans(spec, calibration[p], p, work / "for-tuner", steps=steps, progress=say)
        probe = probe or launch.link
        runs += launch.fit_runs(dict(calibration[p]), warmup)
    pre_path = work / "for-tuner.profile.json"
    write_profile(base.model_copy(update={"calibration": fit(table, runs, probe=probe)}), pre_path)
    evals: dict[int, list[tuple[str, str, str]]] = {p: [] for p in RANKS}
    for p, sched, m, part, chunks in CLASSIC:
        text = generate_text(sched, p, m, chunks, model, part, profile=str(base_path), **shape)
        name = f"{sched}-p{p}-m{m}" + ("-params" if part == "parameters" else "")
        evals[p].append((name, text, "classic"))
    for p, m in TUNED:
        log(f"  tuning p{p} m{m}")
        evals[p].append((f"tuned-p{p}-m{m}", tuned_plan(model, pre_path, base_path, p, m), "tuned"))

    # The calibration the errors are for, run in the same launches as the evaluation plans and
    # alternating with them, so that a slow spell of the machine falls on both alike.
    log(f"{model}: calibration and evaluation runs")
    runs, fitted_on, cal_loads, measured = [], [], {}, {}
    for p in RANKS:
        mine = [x for pair in zip_longest(calibration[p], [(n, t) for n, t, _ in evals[p]])
                for x in pair if x is not None]
        launch = run_plans(spec, mine, p, work, steps=steps, progress=say)
        probe = launch.link or probe
        runs += launch.fit_runs(dict(calibration[p]), warmup)
        for r in launch.runs:
            if r.name in dict(calibration[p]):
                fitted_on.append(r.name)
                cal_loads[r.name] = r.other_load
            else:
                measured[r.name] = r
    log(f"{model}: fitting")
    cal = fit(table, runs, probe=probe,
              source=f"{len(runs)} calibration plans on {RANKS} processes, {steps} steps each, "
                     f"{warmup} not timed")
    cal_path = work / "calibrated.profile.json"
    write_profile(base.model_copy(update={"calibration": cal}), cal_path)

    rows = []
    cal_table = read_profile(cal_path).cost_table(cal_path)
    loopback = get_link("loopback")
    for p in RANKS:
        for name, text, kind in evals[p]:
            r = measured[name]
            plan = parse_plan(text, name)
            (work / f"{name}.octo").write_text(text)
            trace = read_trace(r.trace, warmup)
            before = compare(plan, SimCosts.from_table(table, plan), loopback, trace)
            after = compare(plan, SimCosts.from_table(cal_table, plan), cal_table.calibration.link,
                            trace)
            rows.append({
                "model": model, "plan": name, "kind": kind, "processes": p,
                "microbatches": plan.microbatches, "measured": after.iteration.measured,
                "spread": trace.spread,
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


SEPARATED = 0.05
"""Pairs of plans whose measured times differ by at least this fraction: apart by more than the
run-to-run noise of this machine, so the prediction must order them right."""


def ranking(rows: list[dict], key: str) -> dict:
    meas = [r["measured"] for r in rows]
    pred = [r[key] for r in rows]
    order_m = sorted(range(len(rows)), key=lambda i: meas[i])
    order_p = sorted(range(len(rows)), key=lambda i: pred[i])
    apart = [(i, j) for i in range(len(rows)) for j in range(i + 1, len(rows))
             if abs(meas[i] - meas[j]) >= SEPARATED * min(meas[i], meas[j])]
    swapped = [(rows[i]["plan"], rows[j]["plan"]) for i, j in apart
               if (meas[i] - meas[j]) * (pred[i] - pred[j]) < 0]
    return {"same": order_m == order_p, "tau": kendall(meas, pred),
            "measured_order": [rows[i]["plan"] for i in order_m],
            "predicted_order": [rows[i]["plan"] for i in order_p],
            "apart": len(apart), "swapped": swapped}


def _summary(sel: list[dict], label: str) -> str:
    tb = [abs(r["before_error"]) for r in sel]
    ta = [abs(r["after_error"]) for r in sel]
    mb = [abs(x) for r in sel for x in r["memory_before"]]
    ma = [abs(x) for r in sel for x in r["memory_after"]]
    worst = max(sel, key=lambda r: abs(r["after_error"]))
    worst_m = max(ma) if ma else float("nan")
    return (f"| {label} | {len(sel)} | {statistics.mean(tb):.1%} | {max(tb):.1%} | "
            f"**{statistics.mean(ta):.1%}** | {max(ta):.1%} ({worst['model']} {worst['plan']}) | "
            f"{statistics.mean(mb):.1%} | {max(mb):.1%} | **{statistics.mean(ma):.1%}** | {worst_m:.1%} |")


SUMMARY_HEAD = ["| plans | n | time MAE before | worst before | time MAE after | worst after | "
                "memory MAE before | worst before | memory MAE after | worst after |",
                "|---|---|---|---|---|---|---|---|---|---|"]


def _section(name: str, results: list[dict]) -> list[str]:
    rows = [r for res in results for r in res["rows"]]
    out = [f"## Allocator `{name}`", "", *SUMMARY_HEAD, _summary(rows, "all")]
    for res in results:
        out.append(_summary(res["rows"], res["model"]))
    for p in RANKS:
        sel = [r for r in rows if r["processes"] == p]
        if sel:
            out.append(_summary(sel, f"{p} processes"))
    for kind in ("classic", "tuned"):
        sel = [r for r in rows if r["kind"] == kind]
        if sel:
            out.append(_summary(sel, f"{kind} plans"))
    out += ["", "Per plan (memory errors per rank: mean / worst rank):", "",
            "| model | plan | kind | proc. | m | other load | measured s | step spread | before s | "
            "before err | after s | after err | memory err before | memory err after |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mb, ma = [abs(x) for x in r["memory_before"]], [abs(x) for x in r["memory_after"]]
        out.append(f"| {r['model']} | {r['plan']} | {r['kind']} | {r['processes']} | {r['microbatches']} "
                   f"| {_cores(r['other_load'])} | {r['measured']:.3f} | {_pct(r['spread'])} "
                   f"| {r['before']:.3f} | {r['before_error']:+.1%} | {r['after']:.3f} "
                   f"| {r['after_error']:+.1%} | {_mem(mb)} | {_mem(ma)} |")
    out += ["", "Ranking (plans ordered by iteration time, measured vs predicted after calibration; "
            "Kendall tau 1 = the same order):", ""]
    for res in results:
        rk, rb = ranking(res["rows"], "after"), ranking(res["rows"], "before")
        out.append(f"- {res['model']}, all plans: **{'same order' if rk['same'] else 'order differs'}** "
                   f"(tau {rk['tau']:.2f}; before calibration {rb['tau']:.2f}); of the "
                   f"{rk['apart']} pairs at least {SEPARATED:.0%} apart in measured time, "
                   f"**{rk['apart'] - len(rk['swapped'])} ordered right**"
                   + (f" (swapped: {', '.join(f'{a} / {b}' for a, b in rk['swapped'])})"
                      if rk["swapped"] else "")
                   + f". Measured: {' < '.join(rk['measured_order'])}. Predicted: "
                   f"{' < '.join(rk['predicted_order'])}.")
        groups: dict[tuple, list] = {}
        for r in res["rows"]:
            groups.setdefault((r["processes"], r["microbatches"]), []).append(r)
        for (p, m), sel in sorted(groups.items()):
            if len(sel) > 1:
                g = ranking(sel, "after")
                gaps = sorted(r["measured"] for r in sel)
                close = min(b / a - 1 for a, b in zip(gaps, gaps[1:]))
                out.append(f"  - {p} processes, {m} micro-batches: {'same order' if g['same'] else 'order differs'}"
                           f" (measured {' < '.join(g['measured_order'])}; predicted "
                           f"{' < '.join(g['predicted_order'])}; closest measured pair {close:.1%} apart)")
    out += ["", "Calibration (fitted on the calibration plans only):", ""]
    for res in results:
        c = res["calibration"]
        out.append(f"- {res['model']}: link {c['link']['latency'] * 1e6:.0f} us + bytes / "
                   f"{c['link']['bandwidth'] / 1e9:.2f} GB/s; "
                   + ", ".join(f"{k} x{c['op_scale'][k]:.3f} + {c['op_overhead'][k] * 1e3:.2f} ms"
                               for k in ("F", "B", "W", "BW"))
                   + f"; cores {c['cores']}, contention {c['contention']:.2f}, oversubscription "
                   f"{c.get('oversubscription', 0.0):.2f}, overlap slowdown "
                   f"{c['overlap_slowdown']:.2f}; optimizer {c['update_per_param'] * 1e9:.2f} ns/parameter; "
                   f"step overhead {c['step_overhead'] * 1e3:.1f} ms; held for W "
                   + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in c.get("act_w_extra", {}).items())
                   + ". Its own runs, simulated after the fit: "
                   + ", ".join(f"{r['plan']} {r['error']:+.1%} (other load "
                               f"{_cores(res['calibration_load'].get(r['plan']))})" for r in c["fit"]["runs"])
                   + ".")
        for n in c["fit"].get("notes", []):
            out.append(f"  - note: {n}")
    return out + [""]


def report(configs: dict[str, list[dict]], loads: list[dict], steps: int, warmup: int,
           seconds: float, command: str) -> str:
    out = ["# Simulator accuracy against real runs (issue 7)", "",
           f"Command: `{command}` ({seconds / 60:.1f} min).", "",
           "Machine: " + _machine() + f". Each plan ran {steps} training steps through the executor "
           f"(deepspeed launcher, gloo, one thread per process); the first {warmup} are not timed. "
           "Measured iteration = median over the timed steps of step start to next step start "
           "(optimizer step included). Error = (simulated - measured) / measured. **Before**: the "
           "plain profile and the built-in `loopback` link. **After**: the profile calibrated on the "
           "calibration plans (1F1B, ZB-H1, ZB-V on 2 and 4 processes) only, run in the same "
           "launches as the evaluation plans, alternating with them; none of the plans "
           "evaluated below was run by calibration (the tuned plans were tuned against an "
           "earlier calibration). Peak memory per rank: measured as the "
           "profiler counts (parameters, gradients, optimizer state as allocated; activations: "
           "saved-tensor hooks plus the W state, after every op of the first step).", "",
           "Load (load average 1/5/15 min; other processes above 5% CPU):", ""]
    for ld in loads:
        out.append(f"- {ld['label']} {ld['time']}: load {ld['loadavg']}; "
                   + ("; ".join(ld["busy"]) if ld["busy"] else "no other busy process"))
    out += ["", "Other load (per plan) = CPU cores used by processes outside the benchmark while "
            "the plan ran, from /proc; the machine has 2. Step spread = (slowest - fastest) / median "
            "of the timed steps' iteration times.", ""]
    for name, results in configs.items():
        out += _section(name, results)
    return "\n".join(out)


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
    p.add_argument("--allocator", default="steady",
                   help="allocator configurations to run, of: " + ", ".join(ALLOCATORS))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3, help="steps not timed at the start of each run")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "accuracy.md"))
    p.add_argument("--workdir", help="keep plans, traces and profiles here (default: a temporary directory)")
    p.add_argument("--report-only", action="store_true",
                   help="write the report again from the raw numbers beside --out (.json), "
                   "without running anything")
    args = p.parse_args()
    raw = Path(args.out).with_suffix(".json")
    if args.report_only:
        data = json.loads(raw.read_text())
        text = report(data["configs"], data["loads"], data["steps"], data["warmup"],
                      data["seconds"], data["command"])
        Path(args.out).write_text(text)
        print(text)
        return 0
    command = "python benchmarks/accuracy.py" + "".join(f" {a}" for a in sys.argv[1:])
    work = Path(args.workdir or tempfile.mkdtemp(prefix="octodsl-accuracy-"))
    start = time.perf_counter()
    loads = [{"label": "before", **machine_load()}]
    configs: dict[str, list[dict]] = {}
    for name in args.allocator.split(","):
        configs[name] = []
        for item in args.models.split(","):
            model, _, shape = item.partition(":")
            dims = tuple(int(x) for x in shape.split("x")) if shape else None
            configs[name].append(evaluate(model, work / name / Path(model).stem, args.steps,
                                          args.warmup, dims, ALLOCATORS[name]))
            loads.append({"label": f"after {model} ({name})", **machine_load()})
    seconds = time.perf_counter() - start
    text = report(configs, loads, args.steps, args.warmup, seconds, command)
    Path(args.out).write_text(text)
    raw.write_text(json.dumps({"command": command, "seconds": seconds, "steps": args.steps,
                               "warmup": args.warmup, "configs": configs, "loads": loads},
                              indent=1))
    print(text)
    log(f"wrote {args.out}; traces in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
