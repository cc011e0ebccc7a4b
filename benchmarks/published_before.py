"""The cost model as it was before issue 26 (commit 3f92284) on benchmarks/published.py's rows:
writes benchmarks/published_before.json, which published.md shows beside the current errors.

    git worktree add /tmp/old 3f92284
    .venv/bin/python benchmarks/published.py --export /tmp/plans
    PYTHONPATH=/tmp/old .venv/bin/python benchmarks/published_before.py /tmp/plans

Each row's plan, as the current benchmark expresses it, is given to the old model the way a
user of that version would have: the header fields it did not have are left out (the old
simulator ran every message beside compute, reduced gradients after the last micro-batch and had
no accumulation pass), the model spec's `flash` and `dropout` are left out and GELU becomes
squared ReLU (the same two GEMMs), and every link between nodes is InfiniBand NDR (the only one
it had). The iteration times are written; published.py counts them as each source counts.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml
from machine import write_outputs  # benchmarks/machine.py (its write_atomic is the old code's too)

OUT = Path(__file__).resolve().parent / "published_before.json"
NEW_FIELDS = r"overlap_\w+|grad_accumulation_fusion|scatter_gather_messages|reduce_scatter|grad_accum_dtype|runtime"


def main() -> int:
    import octodsl
    from octodsl.costs.devices import get_device, get_link
    from octodsl.costs.resolve import cost_table
    from octodsl.lang import parse_plan
    from octodsl.sim import SimCosts, compile, simulate

    plans = Path(sys.argv[1])
    specs = plans / "old-specs"
    specs.mkdir(exist_ok=True)
    rows = json.loads((OUT.parent / "published.json").read_text())["rows"]
    out = {"octodsl": octodsl.__file__, "iteration_time": {}}
    for r in rows:
        text = re.sub(rf"\n  ({NEW_FIELDS}) \w+", "", (plans / f"{r['id']}.octo").read_text())
        path = Path(re.search(r'model "([^"]+)"', text).group(1))
        spec = yaml.safe_load(path.read_text())
        spec.pop("dropout", None)
        spec["attention"].pop("flash", None)
        if spec["mlp"]["activation"] == "gelu":
            spec["mlp"]["activation"] = "relu2"
        old = specs / path.name
        old.write_text(yaml.safe_dump(spec))
        plan = parse_plan(text.replace(str(path), str(old)), path=r["id"])
        h = plan.header
        table = cost_table(
            model=str(old), device=r["device"], microbatch_size=h.microbatch_size, tp=h.tp, sp=h.sp
        )
        result = simulate(
            compile(plan),
            SimCosts.from_table(table, plan),
            get_link(get_device(r["device"]).node_link),
            inter_link=get_link("ib-ndr"),
        )
        out["iteration_time"][r["id"]] = result.iteration_time
        print(r["id"], f"{result.iteration_time:.4f} s", flush=True)
    return 0 if write_outputs("published_before.py", {OUT: json.dumps(out, indent=1) + "\n"}) else 2


if __name__ == "__main__":
    sys.exit(main())
