"""The last screen of `make demo`: the training losses falling, and the step time of that run as
measured next to what `octodsl simulate` predicts for it from each cost source.

    python examples/demo_summary.py TRAIN.log --task modadd --model nemotron-h-tiny \\
        --compare "profile measured just now=profile.compare.json" \\
        --compare "analytical cpu costs=analytical.compare.json"

TRAIN.log holds examples/train.py's output (its JSON step lines; other lines are skipped); each
--compare is LABEL=FILE with `octodsl compare --json` output for the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from octodsl.models import load_model
from octodsl.synthetic import TASKS

SHOWN_STEPS = (1, 5, 10, 15, 20)
"""Steps (counted from 1) whose loss the summary shows, as far as the run went."""


def losses(lines) -> list[float]:
    """The loss of each step, in order, from train.py's JSON step lines."""
    out = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and {"step", "loss"} <= row.keys():
            out.append(float(row["loss"]))
    return out


def loss_line(run: list[float], floor: float, alphabet: int) -> str:
    shown = [s for s in SHOWN_STEPS if s <= len(run)]
    if len(run) not in shown:
        shown.append(len(run))
    steps = "  ".join(f"step {s}: {run[s - 1]:.2f}" for s in shown)
    return (f"loss  {steps}\n      (ln {alphabet} = {floor:.2f} is the loss of a model that knows "
            f"which {alphabet} ids occur but not the rule)")


def time_lines(compares: list[tuple[str, dict]]) -> list[str]:
    """Measured iteration time once, then each source's simulated time and its error."""
    if not compares:
        return []
    first = compares[0][1]
    measured = _iteration(first)["measured"]
    out = [f"step time, median of {first['timed_steps']} of {first['steps']} steps (the first not "
           f"timed): measured {measured:.3f} s"]
    for label, result in compares:
        it = _iteration(result)
        out.append(f"  simulated {it['simulated']:.3f} s ({it['error']:+.0%}) from {label} "
                   f"[{result['costs']}]")
    return out


def _iteration(result: dict) -> dict:
    return next(m for m in result["metrics"] if m["metric"] == "iteration")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log")
    p.add_argument("--task", choices=list(TASKS), required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--compare", action="append", default=[], metavar="LABEL=FILE")
    args = p.parse_args(argv)
    try:
        with open(args.log) as f:
            run = losses(f)
        compares = []
        for item in args.compare:
            label, _, path = item.partition("=")
            with open(path) as f:
                compares.append((label, json.load(f)))
    except (OSError, ValueError) as e:
        print(f"demo_summary.py: error: {e}", file=sys.stderr)
        return 2
    if not run:
        print(f"demo_summary.py: error: {args.log} has no step lines", file=sys.stderr)
        return 2
    task, vocab = TASKS[args.task], load_model(args.model).vocab
    print(loss_line(run, task.floor(vocab), task.alphabet(vocab)))
    for line in time_lines(compares):
        print(line)
    if compares:
        load = os.getloadavg()[0]
        print(f"  (load average {load:.1f} on {os.cpu_count()} cores now: other processes on them "
              "slow the measured run and the profile alike)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
