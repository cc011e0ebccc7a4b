"""Run plans through the executor on this machine, with the deepspeed launcher, and collect
their measured traces (worker.py runs on every rank).

    runs = run_plans(spec, [("1f1b-p2-m4", plan_text), ...], processes=2, workdir=...)

One launch per process count runs all its plans in one process group (the launcher and
DeepSpeed's start-up cost about 15 s each time). Progress goes to a callback.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..fileio import write_atomic
from ..models.spec import ModelSpec

WORKER = Path(__file__).resolve().parent / "worker.py"
DEFAULT_CONFIG = {
    # examples/ds_config.json without the batch sizes (the worker sets them per plan)
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.01},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 5},
    },
    "gradient_clipping": 1.0,
    "steps_per_print": 1000000,
    "wall_clock_breakdown": False,
}

Progress = Callable[[str, dict], None]
"""progress(event, fields): 'launch', 'probe', 'run', 'step', 'done' (the worker's events)."""


class RunError(RuntimeError):
    """A launch that failed; the message carries the tail of its output."""


@dataclass
class PlanRun:
    name: str
    trace: Path
    step_seconds: list[float]
    memory: dict = field(default_factory=dict)
    other_load: float | None = None
    """CPU cores other processes used while it ran, on average (None: unknown)."""


@dataclass
class Launch:
    processes: int
    runs: list[PlanRun]
    link: list[tuple[int, float]]
    """(bytes, one-way seconds) of the link probe."""
    seconds: float
    other_load: float | None = None
    """CPU cores that processes outside this launch used meanwhile, on average (None: unknown)."""

    def fit_runs(self, plans: dict[str, str], warmup: int) -> list:
        """The runs of `plans` (name -> .octo text) in this launch, in its order, as the fit
        takes them (octodsl.calibrate.fit.Run), their first `warmup` steps not timed."""
        from ..lang import parse_plan
        from .fit import Run
        from .measured import read_trace

        return [
            Run(parse_plan(plans[r.name], r.name), read_trace(r.trace, warmup), r.name)
            for r in self.runs
            if r.name in plans
        ]


class LoadMonitor:
    """Measures, in a background thread, the CPU time of every process that is not this one or
    a descendant (other people's jobs on a shared machine) from /proc; `cores` is their average
    use in cores since start. Linux only (elsewhere None)."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.cores: float | None = None
        self.used = 0.0
        """Core-seconds the others used so far."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __enter__(self):
        if Path("/proc/self/stat").exists():
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @staticmethod
    def _sample() -> dict[int, tuple[int, int]]:
        """pid -> (parent pid, CPU ticks so far)."""
        out = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            fields = text[text.rfind(")") + 2 :].split()
            out[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
        return out

    def _run(self) -> None:
        me = os.getpid()
        prev = self._sample()
        t0 = t_prev = time.monotonic()
        used = 0.0
        while not self._stop.wait(self.interval):
            now = self._sample()
            t = time.monotonic()
            children: dict[int, list[int]] = {}
            for pid, (ppid, _) in now.items():
                children.setdefault(ppid, []).append(pid)
            mine, todo = set(), [me]
            while todo:
                pid = todo.pop()
                mine.add(pid)
                todo.extend(children.get(pid, ()))
            used += (
                sum(
                    ticks - prev[pid][1]
                    for pid, (_, ticks) in now.items()
                    if pid in prev and pid not in mine
                )
                / self._ticks
            )
            prev, t_prev = now, t
            self.used = used
            self.cores = used / (t_prev - t0) if t_prev > t0 else None

    def mark(self) -> tuple[float, float]:
        return self.used, time.monotonic()

    def since(self, mark: tuple[float, float]) -> float | None:
        """Average cores the others used since `mark` (None when not measured)."""
        if self.cores is None:
            return None
        dt = time.monotonic() - mark[1]
        return (self.used - mark[0]) / dt if dt > 0 else None


def deepspeed_launcher() -> str:
    here = Path(sys.executable).parent / "deepspeed"
    if here.exists():
        return str(here)
    found = shutil.which("deepspeed")
    if found is None:
        raise RunError("the deepspeed launcher is not installed (pip install deepspeed)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_plans(
    spec: ModelSpec,
    plans: list[tuple[str, str]],
    processes: int,
    workdir: str | Path,
    *,
    steps: int = 4,
    config: dict | None = None,
    seed: int = 1234,
    link_probe: bool = True,
    timeout: float = 1800.0,
    progress: Progress | None = None,
) -> Launch:
    """Run each (name, .octo text) plan for `steps` training steps on `processes` ranks; the
    traces go to workdir/NAME.trace.json. Raises RunError when the launch fails."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tag = f"p{processes}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    job_path = workdir / f"job-{tag}.json"
    out_path = workdir / f"launch-{tag}.json"
    job = {
        "model": spec.model_dump(),
        "config": dict(config or DEFAULT_CONFIG),
        "seed": seed,
        "steps": steps,
        "link_probe": link_probe,
        "out": str(out_path),
        "runs": [
            {"name": name, "plan": text, "trace": str(workdir / f"{name}.trace.json")}
            for name, text in plans
        ],
    }
    write_atomic(job_path, json.dumps(job, allow_nan=False))
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONUNBUFFERED": "1",
    }
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    cmd = [
        deepspeed_launcher(),
        "--num_gpus",
        str(processes),
        "--master_port",
        str(_free_port()),
        str(WORKER),
        str(job_path),
    ]
    if progress:
        progress("launch", {"processes": processes, "plans": len(plans)})
    start = time.perf_counter()
    tail: list[str] = []
    marks: dict[str, tuple[float, float]] = {}
    loads: dict[str, float | None] = {}
    with LoadMonitor() as monitor:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=str(workdir),
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                tail = (tail + [line.rstrip()])[-60:]
                text = line.strip()
                if text.startswith('{"event"'):
                    try:
                        event = json.loads(text)
                    except json.JSONDecodeError:
                        continue
                    if event["event"] == "run":
                        marks[event["run"]] = monitor.mark()
                    elif event["event"] == "done" and event["run"] in marks:
                        loads[event["run"]] = monitor.since(marks[event["run"]])
                    if progress:
                        progress(event.pop("event"), event)
                if time.perf_counter() - start > timeout:
                    proc.kill()
                    raise RunError(
                        f"the launch of {processes} processes took more than {timeout:.0f} s"
                    )
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if code != 0 or not out_path.exists():
        raise RunError(
            f"the executor failed on {processes} processes (exit code {code}):\n"
            + "\n".join(tail[-25:])
        )
    out = json.loads(out_path.read_text())
    runs = [
        PlanRun(
            r["name"],
            Path(r["trace"]),
            r["step_seconds"],
            r.get("memory", {}),
            loads.get(r["name"]),
        )
        for r in out["runs"]
    ]
    return Launch(
        processes,
        runs,
        [tuple(x) for x in out.get("link", [])],
        time.perf_counter() - start,
        monitor.cores,
    )
