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
layer, and are left out. An entry may give instead the layer's forward and backward together
as an overhead over the same layer's without recompute or sequence parallelism (its source's
baseline): that ratio is compared, its error being the ratio of the two combined times.
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


def simulate(entry: dict, sp: bool, recompute: str) -> tuple[float, float]:
    """(forward, backward) seconds of one transformer layer of the entry's model, as the
    analytical model costs it on the entry's device and tp, with sequence parallelism `sp` and
    `recompute`."""
    from octodsl.costs.levers import recomputed
    from octodsl.costs.resolve import cost_table
    from octodsl.plan import Recompute

    table = cost_table(
        model=str(P.write_spec(entry["model"])),
        device=entry["device"],
        microbatch_size=entry["microbatch_size"],
        tp=entry["tp"],
        sp=sp,
    )
    layers = [next(c for c in table.layers if c.kind == kind) for kind in LAYER_KINDS]
    forward = sum(c.f for c in layers)
    # what the backward runs again, as a recomputing stage's B costs it (no bytes asked here)
    again, _ = recomputed(
        Recompute(recompute), forward, 0.0, sum(c.sel_f for c in layers), 0.0, 0.0
    )
    return forward, sum(c.b + c.w for c in layers) + float(again)


def measure(entry: dict) -> dict:
    """The entry's published and simulated figures and their errors: (forward, backward)
    seconds, or the combined time's overhead over the baseline layer's (`overhead`)."""
    forward, backward = simulate(entry, entry["sequence_parallel"], entry["recompute"])
    out = {
        "id": entry["id"],
        "where": entry["where"],
        "model": entry["model"]["name"],
        "sp": entry["sequence_parallel"],
        "recompute": entry["recompute"],
    }
    if "combined_overhead_pct" in entry:
        base = sum(simulate(entry, False, "none"))
        published = entry["combined_overhead_pct"] / 100
        simulated = (forward + backward) / base - 1
        return out | {
            "overhead": True,
            "published": (published,),
            "simulated": (simulated,),
            "errors": ((1 + simulated) / (1 + published) - 1,),
        }
    published_s = (entry["forward_ms"] / 1e3, entry["backward_ms"] / 1e3)
    return out | {
        "overhead": False,
        "published": published_s,
        "simulated": (forward, backward),
        "errors": (forward / published_s[0] - 1, backward / published_s[1] - 1),
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
        f"**{len(errs)} figures of {len(results)} entries (the errors of times and of combined "
        "times): mean |error| "
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
        "## Times",
        "",
        "| entry | model | sequence parallel | recompute | forward ms: published | simulated "
        "| error | backward ms: published | simulated | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in results if not r["overhead"]):
        (pf, pb), (sf, sb), (ef, eb) = r["published"], r["simulated"], r["errors"]
        lines.append(
            f"| {r['id']} | {r['model']} | {'yes' if r['sp'] else 'no'} | {r['recompute']} | "
            f"{1e3 * pf:g} | {1e3 * sf:.2f} | {P.pct(ef)} | {1e3 * pb:g} | {1e3 * sb:.2f} | "
            f"{P.pct(eb)} |"
        )
    lines += [
        "",
        "## Overheads over the layer without recompute or sequence parallelism",
        "",
        "The forward and backward together, over the same layer's without recompute or "
        "sequence parallelism; the error is the ratio of the two combined times.",
        "",
        "| entry | model | sequence parallel | recompute | overhead: published | simulated "
        "| error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in results if r["overhead"]):
        lines.append(
            f"| {r['id']} | {r['model']} | {'yes' if r['sp'] else 'no'} | {r['recompute']} | "
            f"{P.pct(r['published'][0])} | {P.pct(r['simulated'][0])} | {P.pct(r['errors'][0])} |"
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
        print(f"{r['id']:40} " + " ".join(f"{P.pct(e):>7}" for e in r["errors"]), flush=True)
    if not write_outputs(
        "published_layers.py",
        {Path(args.output): report(results, data, time.perf_counter() - t0)},
    ):
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
