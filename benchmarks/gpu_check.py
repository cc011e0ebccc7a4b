"""The tables of benchmarks/gpu_check.sh, from what its runs wrote (no GPU needed here, so each
part is testable on the CPU: tests/deepspeed_ext/test_gpu_check.py):

    gpu_check.py executor RESULT.json...     the executor equivalence runs (harness.py and
                                             tp_cases.py results) against their references
    gpu_check.py costs PROFILE.json --device D   per distinct layer: analytical F, B, W on the
                                             built-in device D against the profile's measured
    gpu_check.py compare COMPARE.json...     `octodsl compare --json`: simulated against measured
                                             iteration time

Each prints a markdown table; `executor` exits 1 when a run is outside its bound (named in the
table), the others 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octodsl.costs.analytical import analytical_costs  # noqa: E402
from octodsl.costs.devices import get_device  # noqa: E402
from octodsl.costs.profile import read_profile  # noqa: E402

TP_LOSS_REL = 1e-5
"""tp 2 against tp 1: the issue's bound on the losses (tests/deepspeed_ext/test_tensor_parallel.py)."""
STOCK_LOSS_REL = 1e-5
"""A plan against stock DeepSpeed on a GPU: bit for bit on the CPU, but CUDA kernels may sum in
another order from run to run (atomics in embedding and scan backwards), so a bound instead."""


def executor_rows(results: list[dict]) -> tuple[list[str], bool]:
    """Markdown rows (case, plan, processes, backend, max loss difference relative to the
    reference, bound, ok) and whether all are within their bounds."""
    rows, ok = [], True
    for result in results:
        for r in result["results"]:
            rel = r.get("loss_rel")
            if rel is None:  # harness.py: against stock, with absolute differences
                rel = r["loss_diff"] / max(abs(x) for x in r["ref_losses"])
            bound = TP_LOSS_REL if result["case"] == "tp" else STOCK_LOSS_REL
            within = rel <= bound
            ok &= within
            exact = "yes" if r.get("exact") else "no" if "exact" in r else "-"
            rows.append(
                f"| {result['case']} | {r['plan']} | {result['world']} | {result['backend']} "
                f"| {rel:.2e} | {bound:.0e} | {exact} | {'ok' if within else 'FAIL'} |"
            )
    return rows, ok


def executor_table(paths: list[str]) -> tuple[str, bool]:
    rows, ok = executor_rows([json.loads(Path(p).read_text()) for p in paths])
    head = [
        "| case | plan | processes | backend | loss diff (rel.) | bound | bit-exact | |",
        "|---|---|---:|---|---:|---:|---|---|",
    ]
    return "\n".join(head + rows), ok


def costs_table(profile_path: str, device: str) -> str:
    """Per distinct measured layer: the analytical F, B, W (ms) of the same spec and shape on
    `device` against the measured ones, and measured / analytical."""
    prof = read_profile(profile_path)
    measured = prof.cost_table(profile_path)
    spec = prof.model
    analytical = analytical_costs(spec, get_device(device))
    head = [
        f"Analytical ({device}) against measured ({prof.device_name}), {spec.name}, "
        f"micro-batch {spec.microbatch_size} x {spec.seq_len}, {spec.dtype}:",
        "",
        "| layers | kind | F ms (an. / meas.) | B ms | W ms | measured / analytical (F+B+W) |",
        "|---|---|---|---|---|---:|",
    ]
    rows = []
    for m in prof.layers:
        i = m.layers[0]
        a, t = analytical.layers[i], measured.layers[i]
        total_a, total_t = a.f + a.b + a.w, t.f + t.b + t.w
        cells = " | ".join(
            f"{1e3 * x:.3f} / {1e3 * y:.3f}" for x, y in ((a.f, t.f), (a.b, t.b), (a.w, t.w))
        )
        ratio = f"{total_t / total_a:.2f}" if total_a > 0 else "-"
        rows.append(f"| {_span(m.layers)} | {m.kind} | {cells} | {ratio} |")
    return "\n".join(head + rows)


def _span(indices: list[int]) -> str:
    text = ", ".join(map(str, indices[:4]))
    return text + (f", ... ({len(indices)})" if len(indices) > 4 else "")


def compare_table(paths: list[str]) -> str:
    """Per `octodsl compare --json` output: its costs, simulated and measured iteration time."""
    head = [
        "| plan | devices | costs | simulated ms | measured ms | error |",
        "|---|---:|---|---:|---:|---:|",
    ]
    rows = []
    for p in paths:
        c = json.loads(Path(p).read_text())
        it = next(m for m in c["metrics"] if m["metric"] == "iteration")
        err = "-" if it["error"] is None else f"{100 * it['error']:+.1f}%"
        rows.append(
            f"| {c['plan']} | {c['devices']} | {c['costs']} | {_ms(it['simulated'])} | "
            f"{_ms(it['measured'])} | {err} |"
        )
    return "\n".join(head + rows)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("executor").add_argument("results", nargs="+")
    costs = sub.add_parser("costs")
    costs.add_argument("profile")
    costs.add_argument("--device", required=True)
    sub.add_parser("compare").add_argument("results", nargs="+")
    args = p.parse_args(argv)
    if args.what == "executor":
        table, ok = executor_table(args.results)
        print(table)
        return 0 if ok else 1
    print(
        costs_table(args.profile, args.device)
        if args.what == "costs"
        else compare_table(args.results)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
