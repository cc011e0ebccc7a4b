"""Simulator accuracy against real runs of the executor on this machine, on plans the calibration
never ran (issues 7 and 19).

    .venv/bin/python benchmarks/accuracy.py [--models nemotron-h-tiny[,jamba-tiny:1x128]]
        [--allocator steady[,default]] [--steps 12] [--warmup 2] [-o benchmarks/accuracy.md]
        [--workdir DIR] [--report-only] [--analyse-only]

Per model:
1. profile it (`octodsl profile`: one thread, medians of 5 taken round-robin);
2. per process count (2 and 4), one launch that runs the calibration plans (what `octodsl
   calibrate --model M --ranks 2,4` runs: 1F1B, ZB-H1 and ZB-V with 2 x processes micro-batches)
   alternating with the held-out plans, which calibration never ran (HELD_OUT: irregular
   placements, 2 and 3 stages per device, V shapes, PyTorch CSVs imported so that the executor
   splits the layers, other micro-batch counts, and plans octodsl's tuner made against the plain
   profile). Calibrated on that launch's calibration runs alone: measured side by side with the
   held-out plans, a slow spell of this shared machine falls on both alike;
3. simulate each held-out plan as it ran (the trace records the executor's split) with the plain
   profile and the built-in `loopback` link (**plain**), and with the calibrated profile
   (**calibrated**), and compare with the measured run (octodsl.calibrate.compare): iteration
   time (median over the steps after the warm-up of step start to next step start), busy time
   per device, the time per op kind (F, B, W, BW summed over the devices), and peak memory per
   rank (the executor's memory counters: parameters, gradients and optimizer state as
   allocated, plus activations as the profiler counts them, after every op of the first step).

Steps: 12 per plan, the first 2 not timed; docs/calibration.md ("Steady state") has the
measurements behind the numbers.

Allocator configurations (--allocator): `steady` runs every process (the profiler,
calibration and evaluation alike) with glibc told to keep freed memory (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_); `default` leaves glibc's defaults, under which it hands freed
activation memory back to the system between micro-batches and page-faults it back in later.

Writes the markdown report (-o/--out) and the raw numbers beside it (.json); `--report-only` writes
the report again from those numbers; `--analyse-only` fits and simulates again from the traces
kept in --workdir (no runs). Run it on a quiet machine: the report states the load average, the
other busy processes before and after, and the CPU other processes used while each plan ran.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine import check_outputs, command_line, table_head, write_outputs  # noqa: E402

from octodsl.calibrate.compare import compare  # noqa: E402
from octodsl.calibrate.fit import Run, fit, stage_bases  # noqa: E402
from octodsl.calibrate.measured import as_ran, read_trace  # noqa: E402
from octodsl.calibrate.plans import calibration_plans  # noqa: E402
from octodsl.calibrate.runner import run_plans  # noqa: E402
from octodsl.costs.devices import get_link  # noqa: E402
from octodsl.costs.profile import read_profile, write_profile  # noqa: E402
from octodsl.fileio import write_atomic  # noqa: E402
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

HELD_OUT = [
    # (processes, what, micro-batches, option): option is the partition of a classic
    # schedule, the stages per device of an interleaved one, the placement of an irregular one
    (2, "gpipe", 6, "time"),
    (2, "dualpipev", 4, "time"),
    (2, "interleaved", 6, 3),
    (2, "zb-v csv", 6, None),
    (2, "irregular csv", 4, (0, 1, 0)),
    (2, "tuned", 6, None),
    (4, "zb-h2", 8, "time"),
    (4, "1f1b", 4, "parameters"),
    (4, "interleaved csv", 8, 3),
    (4, "dualpipev", 8, "time"),
    (4, "irregular csv", 8, (0, 1, 2, 3, 0)),
    (4, "tuned", 8, None),
]
"""The plans calibration never runs. `csv`: written as a PyTorch action CSV and imported
(`octodsl convert`), so the plan names no layers and the executor splits them."""

STEPS, WARMUP = 12, 2
"""Training steps per plan and how many at the start are not timed: docs/calibration.md
("Steady state") has the measurements behind them."""

CALIBRATED_AT = {p: 2 * p for p in RANKS}
"""Micro-batches of the calibration plans per process count (octodsl.calibrate.plans)."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine_load() -> dict:
    load = os.getloadavg()
    ps = subprocess.run(
        ["ps", "-eo", "pcpu,pid,args", "--sort=-pcpu"], capture_output=True, text=True
    ).stdout.splitlines()[1:]
    me = {os.getpid(), os.getppid()}
    busy = []
    for line in ps:
        parts = line.split(None, 2)
        if len(parts) == 3 and float(parts[0]) >= 5 and int(parts[1]) not in me:
            busy.append(f"{parts[0]}% {parts[2][:90]}")
    return {
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "loadavg": [round(x, 2) for x in load],
        "busy": busy[:8],
    }


def irregular_plan(name: str, placement: tuple[int, ...], microbatches: int, header: str) -> str:
    """Stages on devices as `placement` says (stage s on device placement[s]), in an order
    every device takes from one global order: every F by stage then micro-batch, then B and W by
    stage from the last (so no device waits on one that waits on it)."""
    stages = len(placement)
    order = [f"F{s}:{m}" for s in range(stages) for m in range(microbatches)]
    order += [
        f"{k}{s}:{m}" for s in reversed(range(stages)) for m in range(microbatches) for k in "BW"
    ]
    devices = max(placement) + 1
    held = {d: [s for s in range(stages) if placement[s] == d] for d in range(devices)}
    lines = [
        f'plan "{name}" {{',
        f"  devices {devices}",
        f"  microbatches {microbatches}",
        header,
        "}",
        "",
        f"stages {stages}",
        "",
        "placement {",
    ]
    lines += [f"  device {d}: stages {', '.join(map(str, held[d]))}" for d in range(devices)]
    lines += ["}", "", "schedule {"]
    for d in range(devices):
        mine = [op for op in order if placement[int(op[1:].split(":")[0])] == d]
        lines += [f"  device {d} {{", "    " + " ".join(mine), "  }"]
    return "\n".join(lines + ["}", ""])


def via_csv(text: str, name: str) -> str:
    """The plan as PyTorch's action CSV states it, imported again: the same order, no layers."""
    from octodsl.interop import read_csv, write_csv

    plan = parse_plan(text, name)
    imported = read_csv(write_csv(plan), f"{name}.csv", name=name)[0]
    imported = replace(
        imported,
        header=imported.header.model_copy(
            update={k: getattr(plan.header, k) for k in ("model", "microbatch_size", "seq_len")}
        ),
    )
    return render_plan(
        imported,
        title=f"{name}: imported from the PyTorch CSV of the plan "
        "(the executor splits the layers).",
    )


def held_out_plans(
    model: str, base_path: Path, shape: dict
) -> dict[int, list[tuple[str, str, list[str]]]]:
    """Per process count: (name, .octo text, tags) of each held-out plan."""
    header = (
        f'  model "{model}"\n  microbatch_size {shape["microbatch_size"]}\n'
        f"  seq_len {shape['seq_len']}"
    )
    out: dict[int, list[tuple[str, str, list[str]]]] = {p: [] for p in RANKS}
    for p, what, m, option in HELD_OUT:
        sched, _, csv = what.partition(" ")
        tags = ["csv"] * bool(csv) + ["other m"] * (m != CALIBRATED_AT[p])
        if sched == "irregular":
            name = f"irregular-p{p}-s{len(option)}-m{m}"
            text = irregular_plan(name, option, m, header)
            tags.append("irregular")
        elif sched == "tuned":
            name = f"tuned-p{p}-m{m}"
            text = tuned_plan(model, base_path, p, m)
            tags.append("tuned")
        else:
            chunks = option if sched == "interleaved" else None
            part = option if isinstance(option, str) else "time"
            name = (
                f"{sched}-p{p}"
                + (f"-v{chunks}" if chunks else "")
                + f"-m{m}"
                + ("-params" if part == "parameters" else "")
            )
            text = generate_text(sched, p, m, chunks, model, part, profile=str(base_path), **shape)
            if sched in ("zb-v", "dualpipev"):
                tags.append("V")
            if chunks:
                tags.append(f"{chunks} stages/device")
        if csv:
            name += "-csv"
            text = via_csv(text, name)
        out[p].append((name, text, tags))
    return out


def tuned_plan(model: str, profile_path: Path, processes: int, microbatches: int) -> str:
    """The tuner's search (octodsl.tune.loop) against the plain profile, from its own starts
    and the profile-balanced 1F1B."""
    from octodsl.tune.pipeline.loop import tune
    from octodsl.tune.problem import Problem

    prof = read_profile(profile_path)
    table = prof.cost_table(profile_path)
    spec = prof.model
    shape = {"microbatch_size": spec.microbatch_size, "seq_len": spec.seq_len}
    header = Header(
        name=f"tuned-p{processes}-m{microbatches}",
        devices=processes,
        microbatches=microbatches,
        model=model,
        **shape,
    )
    problem = Problem(table, header, get_link("loopback"))
    start = parse_plan(
        generate_text(
            "1f1b", processes, microbatches, None, model, "time", profile=str(profile_path), **shape
        )
    )
    best = tune(problem, budget=30.0, seed=0, starts=[replace(start, header=header)]).best
    return render_plan(
        replace(best.plan, header=header),
        title=f"Tuned by octodsl's tuner against {profile_path.name} "
        f"(simulated {best.time:.3f} s).",
    )


def evaluate(
    model: str, work: Path, steps: int, warmup: int, shape: tuple[int, int] | None, env: dict
) -> dict:
    spec = load_model(model).with_shape(*(shape or (None, None)))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the launched processes inherit it
    try:
        return analyse(measure(model, spec, work, steps), warmup)
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
    write_atomic(spec_path, json.dumps(spec.model_dump()))
    cmd = [
        str(Path(sys.executable).parent / "octodsl"),
        "profile",
        "--model",
        str(spec_path),
        "--threads",
        "1",
        "--warmup",
        "2",
        "--repeats",
        "5",
        "-o",
        str(path),
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    if done.returncode != 0:
        sys.exit(f"profiling failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return read_profile(path)


def measure(model: str, spec, work: Path, steps: int) -> Path:
    """Profile, then run the calibration and held-out plans; returns the manifest (work /
    manifest.json) that `analyse` reads: every plan's text, trace and the load while it ran."""
    work.mkdir(parents=True, exist_ok=True)
    log(f"{model}: profiling")
    base_path = work / "base.profile.json"
    base = _profile(spec, work, base_path)
    shape = {"microbatch_size": base.model.microbatch_size, "seq_len": base.model.seq_len}
    calibration = {
        p: [
            (name, text)
            for q, name, text in calibration_plans(model, str(base_path), list(RANKS), shape=shape)
            if q == p
        ]
        for p in RANKS
    }
    log(f"{model}: building the held-out plans (tuning two)")
    held = held_out_plans(model, base_path, shape)
    say = lambda e, f: log(f"  {e} {f}") if e in ("run", "launch") else None  # noqa: E731
    log(f"{model}: calibration and held-out runs")
    plans, probe = [], []
    for p in RANKS:
        mine = interleave(calibration[p], [(n, t) for n, t, _ in held[p]])
        launch = run_plans(spec, mine, p, work, steps=steps, progress=say)
        probe = probe or launch.link
        tags = {n: tg for n, _, tg in held[p]}
        for r in launch.runs:
            text = dict(mine)[r.name]
            write_atomic(work / f"{r.name}.octo", text)
            plans.append(
                {
                    "name": r.name,
                    "processes": p,
                    "trace": str(r.trace),
                    "plan": f"{r.name}.octo",
                    "other_load": r.other_load,
                    "calibration": r.name in dict(calibration[p]),
                    "tags": tags.get(r.name, []),
                }
            )
    manifest = work / "manifest.json"
    write_atomic(
        manifest,
        json.dumps(
            {
                "model": model,
                "steps": steps,
                "profile": base_path.name,
                "probe": probe,
                "plans": plans,
            },
            indent=1,
        ),
    )
    return manifest


def interleave(calibration: list, held: list) -> list:
    """The held-out plans spread evenly between the calibration plans, so that each runs next
    to one: this machine's speed drifts by 10-35% over minutes (docs/calibration.md)."""
    out, per = [], len(held) / max(len(calibration), 1)
    for i, cal in enumerate(calibration):
        out += held[round(i * per) : round((i + 0.5) * per)] + [cal]
        out += held[round((i + 0.5) * per) : round((i + 1) * per)]
    return out


def analyse(manifest_path: Path, warmup: int) -> dict:
    """Fit the calibration on the manifest's calibration runs and compare every held-out run
    with its simulation, plain and calibrated."""
    work = manifest_path.parent
    manifest = json.loads(manifest_path.read_text())
    model = manifest["model"]
    base_path = work / manifest["profile"]
    base = read_profile(base_path)
    table = base.cost_table(base_path)
    plans = manifest["plans"]
    traces = {r["name"]: read_trace(r["trace"], warmup) for r in plans}
    runs = [
        Run(parse_plan((work / r["plan"]).read_text(), r["name"]), traces[r["name"]], r["name"])
        for r in plans
        if r["calibration"]
    ]
    log(f"{model}: fitting")
    models, fits = {"plain": (table, get_link("loopback"))}, {}
    for key, sel in (
        ("3-schedule", [r for r in runs if "-interleaved-" not in r.name]),
        ("calibrated", runs),
    ):
        c = fit(
            table,
            sel,
            probe=manifest["probe"],
            source=f"{len(sel)} calibration plans on {RANKS} processes, {manifest['steps']} "
            f"steps each, {warmup} not timed",
        )
        path = work / f"{key}.profile.json"
        write_profile(base.model_copy(update={"calibration": c}), path)
        tab = read_profile(path).cost_table(path)
        models[key], fits[key] = (tab, tab.calibration.link), c
    cal_table = models["calibrated"][0]
    rows, residual = [], []
    for r in plans:
        trace = traces[r["name"]]
        if r["calibration"]:
            plan = parse_plan((work / r["plan"]).read_text(), r["name"])
            c = compare(
                plan, SimCosts.from_table(cal_table, plan), cal_table.calibration.link, trace
            )
            residual += op_residuals(c, r, table)
            continue
        plan = as_ran(parse_plan((work / r["plan"]).read_text(), r["name"]), trace)
        row = {
            "model": model,
            "plan": r["name"],
            "tags": r["tags"],
            "processes": r["processes"],
            "microbatches": plan.microbatches,
            "spread": trace.spread,
            "other_load": r["other_load"],
            "timed_steps": len(trace.timed),
            "periods": [s.period for s in trace.timed if s.period is not None],
        }
        for key, (tab, link) in models.items():
            c = compare(plan, SimCosts.from_table(tab, plan), link, trace)
            row["measured"] = c.iteration.measured
            row[key] = {
                "iteration": c.iteration.simulated,
                "error": c.iteration.error,
                "busy": [m.error for m in c.busy],
                "kinds": {m.name.split()[0]: m.error for m in c.kinds},
                "memory": [m.error for m in c.peak or []],
            }
        residual += op_residuals(c, r, table)
        row["peak_measured"] = [
            float(x) for x in (trace.peak_memory if trace.peak_memory is not None else [])
        ]
        rows.append(row)
        log(
            f"  {r['name']}: measured {row['measured']:.3f} s, plain {row['plain']['error']:+.1%}, "
            f"calibrated {row['calibrated']['error']:+.1%}"
        )
    loads = {r["name"]: r["other_load"] for r in plans if r["calibration"]}
    return {
        "model": model,
        "models": list(models),
        "calibration": json.loads(fits["calibrated"].model_dump_json()),
        "fitted_on": [r.name for r in runs],
        "calibration_load": loads,
        "rows": rows,
        "residuals": residual,
        "warmup": warmup,
        # every step's period, the warm-up included
        "periods": {
            name: [s.period for s in t.steps if s.period is not None] for name, t in traces.items()
        },
    }


def op_residuals(c, run: dict, table) -> list[dict]:
    """Per (kind, stage) of a run: the median measured duration over the timed steps and
    micro-batches against the simulated one (the last model of `compare`), with what the
    stage is: its layers, where it sits, how many stages share its device, and its profiled
    seconds (fit.stage_bases)."""
    plan = c.plan
    home, bases = plan.stage_device(), stage_bases(table, plan)
    sim, meas = defaultdict(list), defaultdict(list)
    for op in c.result.ops():
        sim[(op.kind, op.stage)].append(op.end - op.start)
    for step in c.measured.timed:
        for op in step.ops:
            meas[(op.kind, op.stage)].append(op.end - op.start)
    out = []
    for (kind, s), durations in sorted(sim.items()):
        st = plan.stages[s]
        first, last = st.bounds
        out.append(
            {
                "run": run["name"],
                "calibration": run["calibration"],
                "processes": run["processes"],
                "kind": kind,
                "stage": s,
                "layers": last - first + 1,
                "position": "first" if s == 0 else "last" if s == plan.num_stages - 1 else "middle",
                "per_device": home.count(home[s]),
                "profiled": bases[(kind, s)],
                "simulated": statistics.median(durations),
                "measured": statistics.median(meas[(kind, s)]),
            }
        )
    return out


def kendall(a: list[float], b: list[float]) -> float:
    n, s = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            s += (
                1
                if (a[i] - a[j]) * (b[i] - b[j]) > 0
                else -1
                if (a[i] - a[j]) * (b[i] - b[j]) < 0
                else 0
            )
    return s / (n * (n - 1) / 2) if n > 1 else 1.0


def separated(a: dict, b: dict) -> bool:
    """Whether the measurements tell two plans apart: the interquartile ranges of their timed
    steps' periods do not overlap (a fixed fraction would not do: the same plan's steps are
    10-35% apart on this machine)."""
    qa = statistics.quantiles(a["periods"], n=4)
    qb = statistics.quantiles(b["periods"], n=4)
    return qa[2] < qb[0] or qb[2] < qa[0]


def ranking(rows: list[dict], key: str) -> dict:
    meas = [r["measured"] for r in rows]
    pred = [r[key]["iteration"] for r in rows]
    order_m = sorted(range(len(rows)), key=lambda i: meas[i])
    order_p = sorted(range(len(rows)), key=lambda i: pred[i])
    apart = [
        (i, j)
        for i in range(len(rows))
        for j in range(i + 1, len(rows))
        if separated(rows[i], rows[j])
    ]
    swapped = [
        (rows[i]["plan"], rows[j]["plan"])
        for i, j in apart
        if (meas[i] - meas[j]) * (pred[i] - pred[j]) < 0
    ]
    return {
        "same": order_m == order_p,
        "tau": kendall(meas, pred),
        "measured_order": [rows[i]["plan"] for i in order_m],
        "predicted_order": [rows[i]["plan"] for i in order_p],
        "apart": len(apart),
        "swapped": swapped,
    }


def _mae(values: list[float]) -> str:
    values = [abs(v) for v in values if v is not None and math.isfinite(v)]
    return f"{statistics.mean(values):.1%}" if values else "-"


def _worst(values: list[float]) -> str:
    values = [abs(v) for v in values if v is not None and math.isfinite(v)]
    return f"{max(values):.1%}" if values else "-"


def _summary(sel: list[dict], label: str, keys: list[str]) -> str:
    cells = [label, str(len(sel))]
    for k in keys:
        errs = [r[k]["error"] for r in sel]
        worst = max(sel, key=lambda r: abs(r[k]["error"]))
        cells += [_mae(errs), f"{_worst(errs)} ({worst['plan']})"]
    last = keys[-1]
    cells += [
        _mae([e for r in sel for e in r[last]["busy"]]),
        _mae([e for r in sel for e in r[last]["memory"]]),
        _worst([e for r in sel for e in r[last]["memory"]]),
    ]
    return "| " + " | ".join(cells) + " |"


def _section(name: str, results: list[dict]) -> list[str]:
    keys = results[0]["models"]
    last = keys[-1]
    rows = [r for res in results for r in res["rows"]]
    head = (
        ["plans", "n"]
        + [f"{h} {k}" for k in keys for h in ("time MAE", "worst")]
        + [f"busy MAE {last}", f"memory MAE {last}", f"memory worst {last}"]
    )
    out = [
        f"## Allocator `{name}`",
        "",
        *table_head(head),
        _summary(rows, "**all held-out**", keys),
    ]
    for res in results:
        out.append(_summary(res["rows"], res["model"], keys))
    for p in RANKS:
        sel = [r for r in rows if r["processes"] == p]
        if sel:
            out.append(_summary(sel, f"{p} processes", keys))
    for tag in sorted({t for r in rows for t in r["tags"]}):
        out.append(_summary([r for r in rows if tag in r["tags"]], tag, keys))
    kinds = ("F", "B", "W", "BW")
    out += [
        "",
        f"Per plan (errors = (simulated - measured) / measured; busy and memory: mean / worst "
        f"device; op kinds: the time all devices spend in ops of the kind per step, {last}):",
        "",
        "| model | plan | tags | proc. | m | other load | timed steps | measured s | step spread | "
        + " | ".join(f"{k} s | {k} err" for k in keys)
        + f" | busy err | {' | '.join(kinds)} | memory err |",
        "|" + "---|" * (9 + 2 * len(keys) + 2 + len(kinds)),
    ]
    for r in rows:
        model_cells = " | ".join(f"{r[k]['iteration']:.3f} | {r[k]['error']:+.1%}" for k in keys)
        kind_cells = " | ".join(
            f"{r[last]['kinds'][k]:+.1%}" if k in r[last]["kinds"] else "-" for k in kinds
        )
        out.append(
            f"| {r['model']} | {r['plan']} | {', '.join(r['tags']) or '-'} | {r['processes']} "
            f"| {r['microbatches']} | {_cores(r['other_load'])} | {r['timed_steps']} "
            f"| {r['measured']:.3f} | {_pct(r['spread'])} | {model_cells} "
            f"| {_mem(r[last]['busy'])} | {kind_cells} | {_mem(r[last]['memory'])} |"
        )
    out += [
        "",
        f"Ranking (held-out plans ordered by iteration time, measured vs predicted, {last}; "
        "Kendall tau 1 = the same order):",
        "",
    ]
    for res in results:
        rk = ranking(res["rows"], last)
        out.append(
            f"- {res['model']}: **{'same order' if rk['same'] else 'order differs'}** "
            f"(tau {rk['tau']:.2f}; "
            + "; ".join(f"{k} {ranking(res['rows'], k)['tau']:.2f}" for k in keys[:-1])
            + f"); of the {rk['apart']} pairs the measurements separate (the interquartile "
            f"ranges of their timed steps do not overlap), **{rk['apart'] - len(rk['swapped'])} "
            "ordered right**"
            + (
                f" (swapped: {', '.join(f'{a} / {b}' for a, b in rk['swapped'])})"
                if rk["swapped"]
                else ""
            )
            + f". Measured: {' < '.join(rk['measured_order'])}. Predicted: "
            f"{' < '.join(rk['predicted_order'])}."
        )
    out += _causes(results)
    out += ["", "Calibration (fitted on the calibration plans only):", ""]
    for res in results:
        c = res["calibration"]
        out.append(
            f"- {res['model']}: link {c['link']['latency'] * 1e6:.0f} us + bytes / "
            f"{c['link']['bandwidth'] / 1e9:.2f} GB/s; "
            + ", ".join(
                f"{k} x{c['op_scale'][k]:.3f} + {c['op_overhead'][k] * 1e3:.2f} ms"
                for k in ("F", "B", "W", "BW")
            )
            + f"; cores {c['cores']}, contention {c['contention']:.2f}, oversubscription "
            f"{c.get('oversubscription', 0.0):.2f}, overlap slowdown "
            f"{c['overlap_slowdown']:.2f}; optimizer {c['update_per_param'] * 1e9:.2f} ns/parameter; "
            f"step overhead {c['step_overhead'] * 1e3:.1f} ms; held for W "
            + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in c.get("act_w_extra", {}).items())
            + ". Its own runs, simulated after the fit: "
            + ", ".join(
                f"{r['plan']} {r['error']:+.1%} (other load "
                f"{_cores(res['calibration_load'].get(r['plan']))})"
                for r in c["fit"]["runs"]
            )
            + "."
        )
        for n in c["fit"].get("notes", []):
            out.append(f"  - note: {n}")
    return out + [""]


def _ratio_row(label: str, sel: list[dict]) -> str:
    cells = [label]
    for kind in ("F", "B", "W", "BW"):
        ratios = [
            r["measured"] / r["simulated"] for r in sel if r["kind"] == kind and r["simulated"] > 0
        ]
        cells.append(f"{statistics.median(ratios):.3f} ({len(ratios)})" if ratios else "-")
    return "| " + " | ".join(cells) + " |"


def _causes(results: list[dict]) -> list[str]:
    """Measured over simulated op durations (calibrated costs), per what a stage is: where the
    costs miss beyond the per-kind scale the fit takes (docs/calibration.md, issue 19)."""
    out = [
        "",
        "Per-op durations, measured / simulated with the calibrated costs (median over "
        "(plan, stage) pairs of the median op over the timed steps and micro-batches; in "
        "brackets the number of pairs), calibration and held-out runs alike:",
        "",
        "| stage | F | B | W | BW |",
        "|---|---|---|---|---|",
    ]
    res = [r for x in results for r in x["residuals"]]
    for label, key in (
        ("layers", "layers"),
        ("position", "position"),
        ("stages on its device", "per_device"),
        ("processes", "processes"),
    ):
        for value in sorted({r[key] for r in res}, key=lambda v: (str(type(v)), v)):
            out.append(_ratio_row(f"{label} {value}", [r for r in res if r[key] == value]))
    out.append(_ratio_row("calibration runs", [r for r in res if r["calibration"]]))
    out.append(_ratio_row("held-out runs", [r for r in res if not r["calibration"]]))
    out += [
        "",
        "Step periods over the run, each step's / the median of the timed steps "
        "(median over the plans; step 0 is the first):",
        "",
    ]
    for x in results:
        runs = [p for p in x["periods"].values() if p]
        n = min(len(p) for p in runs)
        warm = x.get("warmup", 0)
        cols = [
            statistics.median(p[k] / statistics.median(p[warm:]) for p in runs) for k in range(n)
        ]
        out.append(f"- {x['model']}: " + " ".join(f"{c:.2f}" for c in cols))
    return out


def report(
    configs: dict[str, list[dict]],
    loads: list[dict],
    steps: int,
    warmup: int,
    seconds: float,
    command: str,
) -> str:
    keys = next(iter(configs.values()))[0]["models"]
    out = [
        "# Simulator accuracy on plans the calibration never ran (issues 7 and 19)",
        "",
        f"Command: `{command}` ({seconds / 60:.1f} min).",
        "",
        "Machine: " + _machine() + f". Each plan ran {steps} training steps through the executor "
        f"(deepspeed launcher, gloo, one thread per process); the first {warmup} are not timed. "
        "Measured iteration = median over the timed steps of step start to next step start "
        "(optimizer step included). Error = (simulated - measured) / measured. Costs: "
        + "; ".join(f"**{k}**: {MODEL_NOTES[k]}" for k in keys)
        + ". Calibration runs 1F1B, "
        "ZB-H1, ZB-V and interleaved on 2 and 4 processes (2 x processes micro-batches) in the "
        "same launches as the held-out plans, spread between them; no held-out plan is run by "
        "calibration. Each held-out plan is simulated as it ran: a plan imported from a CSV "
        "with the layers the executor gave its stages (the trace records them). Peak memory "
        "per rank: the executor's memory counters (parameters, gradients, optimizer state as "
        "allocated; activations: saved-tensor hooks plus the W state, after every op of the "
        "first step).",
        "",
        "Load (load average 1/5/15 min; other processes above 5% CPU):",
        "",
    ]
    for ld in loads:
        out.append(
            f"- {ld['label']} {ld['time']}: load {ld['loadavg']}; "
            + ("; ".join(ld["busy"]) if ld["busy"] else "no other busy process")
        )
    out += [
        "",
        "Other load (per plan) = CPU cores used by processes outside the benchmark while "
        "the plan ran, from /proc; the machine has 2. Step spread = (slowest - fastest) / median "
        "of the timed steps' iteration times.",
        "",
    ]
    for name, results in configs.items():
        out += _section(name, results)
    return "\n".join(out)


MODEL_NOTES = {
    "plain": "the profile as measured and the built-in `loopback` link",
    "3-schedule": "the profile calibrated on the 1F1B, ZB-H1 and ZB-V calibration runs alone (the "
    "calibration set before issue 19)",
    "calibrated": "the profile calibrated on every calibration run (`octodsl calibrate`'s fit: "
    "1F1B, ZB-H1, ZB-V and interleaved)",
}


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
    p.add_argument(
        "--models",
        default="nemotron-h-tiny",
        help="models, each optionally NAME:BxS (micro-batch size x sequence length); "
        "default nemotron-h-tiny at its 2 x 256 (jamba-tiny:1x128 adds jamba-tiny: "
        "its Mamba1 scan is slow on a CPU)",
    )
    p.add_argument(
        "--allocator",
        default="steady",
        help="allocator configurations to run, of: " + ", ".join(ALLOCATORS),
    )
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument(
        "--warmup", type=int, default=WARMUP, help="steps not timed at the start of each run"
    )
    p.add_argument("-o", "--out", default=str(ROOT / "benchmarks" / "accuracy.md"))
    p.add_argument(
        "--workdir", help="keep plans, traces and profiles here (default: a temporary directory)"
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="write the report again from the raw numbers beside -o/--out (.json), "
        "without running anything",
    )
    p.add_argument(
        "--analyse-only",
        action="store_true",
        help="fit and simulate again from the traces in --workdir (a run's), without "
        "running anything",
    )
    args = p.parse_args()
    out = Path(args.out)
    raw = out.with_suffix(".json")
    runs = not (args.report_only or args.analyse_only)  # a run fills --workdir
    if not check_outputs(
        "accuracy.py",
        [out] if args.report_only else [out, raw],
        [args.workdir] if args.workdir and runs else [],
    ):
        return 2
    if args.report_only:
        data = json.loads(raw.read_text())
        text = report(
            data["configs"],
            data["loads"],
            data["steps"],
            data["warmup"],
            data["seconds"],
            data["command"],
        )
        if not write_outputs("accuracy.py", {out: text}):
            return 2
        print(text)
        return 0
    if args.analyse_only and not args.workdir:
        p.error("--analyse-only needs the --workdir of a run")
    command = command_line("python benchmarks/accuracy.py")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="octodsl-accuracy-"))
    start = time.perf_counter()
    loads = [{"label": "before", **machine_load()}]
    configs: dict[str, list[dict]] = {}
    for name in args.allocator.split(","):
        configs[name] = []
        for item in args.models.split(","):
            model, _, shape = item.partition(":")
            dims = tuple(int(x) for x in shape.split("x")) if shape else None
            where = work / name / Path(model).stem
            if args.analyse_only:
                manifest = json.loads((where / "manifest.json").read_text())
                args.steps = manifest["steps"]
                configs[name].append(analyse(where / "manifest.json", args.warmup))
                continue
            configs[name].append(
                evaluate(model, where, args.steps, args.warmup, dims, ALLOCATORS[name])
            )
            loads.append({"label": f"after {model} ({name})", **machine_load()})
    seconds = time.perf_counter() - start
    if args.analyse_only and raw.exists():  # the run's figures, not this analysis's
        old = json.loads(raw.read_text())
        loads, seconds = old["loads"], old["seconds"]
        command = f"{old['command']}, analysed again with `{command}`"
    text = report(configs, loads, args.steps, args.warmup, seconds, command)
    numbers = {
        "command": command,
        "seconds": seconds,
        "steps": args.steps,
        "warmup": args.warmup,
        "configs": configs,
        "loads": loads,
    }
    if not write_outputs("accuracy.py", {out: text, raw: json.dumps(numbers, indent=1)}):
        return 2
    print(text)
    log(f"wrote {args.out}; traces in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
