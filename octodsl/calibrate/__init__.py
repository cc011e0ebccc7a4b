"""Close the loop between the simulator and real runs (`octodsl compare`, `octodsl calibrate`).

    trace = read_trace("measured.json")                   # measured.py: steps, busy, memory
    c = compare(plan, SimCosts.from_table(table, plan), link, trace)   # compare.py
    cal = fit(profile_table, [Run(plan, trace), ...], probe=...)        # fit/
    launch = run_plans(spec, [(name, text), ...], processes=4, workdir=...)  # runner.py

The fitted parameters go into the profile (`Profile.calibration`) and reach the simulator only
through the cost table (`CostTable.calibration` -> StageCost, SimCosts): one cost path. See
docs/calibration.md.
"""

from .compare import Comparison, Metric, compare
from .fit import Run, fit
from .measured import MeasuredTrace, TraceError, check_against, parse_trace, read_trace

__all__ = [
    "Comparison",
    "MeasuredTrace",
    "Metric",
    "Run",
    "TraceError",
    "check_against",
    "compare",
    "fit",
    "parse_trace",
    "read_trace",
]
