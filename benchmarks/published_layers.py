"""One transformer layer's published forward and backward times against the analytical cost
model: writes benchmarks/published_layers.md.

    .venv/bin/python benchmarks/published_layers.py [-o benchmarks/published_layers.md]

Each entry of published_runs.yaml's `layer_times` is a source's timing of one transformer layer
(an attention and an MLP layer in octodsl's terms), with no pipeline, no pipeline messages and
no data parallelism around it: the per-layer model alone (the GEMMs by shape, the attention
core, the memory-bound kernels, the tensor-parallel collectives), checked where the iteration
rows of benchmarks/published.md cannot separate it from the rest. The layer's costs are
`octodsl models`' (the source's defaults filled in as for its iteration rows: device, dtype,
dropout, attention kernel): the forward is F; the backward is B + W and, with recompute, what
the mode runs again (full: the forward, its collectives included; selective: what it drops).
A pipeline op's host overheads (docs/models-and-costs.md, "Overheads") are per op, not per
layer, and are left out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import published as P  # noqa: E402
from machine import check_outputs, commit, cpu_model, write_outputs  # noqa: E402

LAYER_KINDS = ("attention", "mlp")
"""The octodsl layers that make one transformer layer of these sources."""


def simulate(entry: dict) -> tuple[float, float]:
    """(forward, backward) seconds of one transformer layer of the entry's model, as the
    analytical model costs it on the entry's device, tp and sequence parallelism."""
    from octodsl.costs.resolve import cost_table

    table = cost_table(
        model=str(P.write_spec(entry["model"])),
        device=entry["device"],
        microbatch_size=entry["microbatch_size"],
        tp=entry["tp"],
        sp=entry["sequence_parallel"],
    )
    layers = [next(c for c in table.layers if c.kind == kind) for kind in LAYER_KINDS]
    forward = sum(c.f for c in layers)
    again = {
        "none": 0.0,
        "full": forward,
        "selective": sum(c.sel_f for c in layers),
    }[entry["recompute"]]
    return forward, sum(c.b + c.w for c in layers) + again


def measure(entry: dict) -> dict:
    forward, backward = simulate(entry)
    published = (entry["forward_ms"] / 1e3, entry["backward_ms"] / 1e3)
    return {
        "id": entry["id"],
        "where": entry["where"],
        "sp": entry["sequence_parallel"],
        "recompute": entry["recompute"],
        "published": published,
        "simulated": (forward, backward),
        "errors": (forward / published[0] - 1, backward / published[1] - 1),
    }


def report(results: list[dict], data: dict, seconds: float) -> str:
    errs = [abs(e) for r in results for e in r["errors"]]
    sources = sorted({e["source"] for e in data["layer_times"]})
    lines = [
        "# One transformer layer against its published times",
        "",
        f"Made by `.venv/bin/python benchmarks/published_layers.py` at commit {commit()} on "
        f"{cpu_model()} in {seconds:.0f} s (the entries and their citations: "
        "benchmarks/published_runs.yaml, `layer_times`; how each is costed: the script's "
        "docstring).",
        "",
        f"**{len(errs)} figures of {len(results)} entries: mean |error| "
        f"{100 * sum(errs) / len(errs):.1f}%, worst {100 * max(errs):.1f}%.** Out of sample: "
        "no constant of the model was fitted to these times (the fitted per-op overheads are "
        "ZeroBubble's, benchmarks/fit_overheads.md, and are not part of a layer's time).",
        "",
        "Sources: "
        + "; ".join(
            f"**{s}**: {data['sources'][s]['cite']} <{data['sources'][s]['url']}>. "
            f"{data['sources'][s].get('hardware', '')}"
            for s in sources
        ),
        "",
        "| entry | sequence parallel | recompute | forward ms: published | simulated | error "
        "| backward ms: published | simulated | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        (pf, pb), (sf, sb), (ef, eb) = r["published"], r["simulated"], r["errors"]
        lines.append(
            f"| {r['id']} | {'yes' if r['sp'] else 'no'} | {r['recompute']} | {1e3 * pf:g} | "
            f"{1e3 * sf:.2f} | {P.pct(ef)} | {1e3 * pb:g} | {1e3 * sb:.2f} | {P.pct(eb)} |"
        )
    lines += ["", "Where each figure is:", ""]
    lines += [f"- **{r['id']}**: {r['where']}." for r in results]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=str(REPO / "benchmarks" / "published_layers.md"))
    args = ap.parse_args()
    if not check_outputs("published_layers.py", [args.output], inputs=[P.DATA]):
        return 2
    data = P.load()
    t0 = time.perf_counter()
    results = []
    for entry in P.rows(data, "layer_times"):
        r = measure(entry)
        results.append(r)
        print(
            f"{r['id']:40} forward {P.pct(r['errors'][0]):>7} backward {P.pct(r['errors'][1]):>7}",
            flush=True,
        )
    if not write_outputs(
        "published_layers.py",
        {Path(args.output): report(results, data, time.perf_counter() - t0)},
    ):
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
