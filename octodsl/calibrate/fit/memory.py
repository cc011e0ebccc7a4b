"""Step 7: per layer kind, the bytes a split backward's weight-gradient state holds from B until
W beyond what the profile's act_w says, from the measured memory around each B."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...costs.table import CostTable
from .observations import Run, stage_layers


def fit_memory(table: CostTable, runs: Sequence[Run]) -> dict[str, float] | None:
    """Per layer kind: bytes held from B until W beyond the profiled act_w (held_for_w), from
    the split stages' measured rise at B (None: no memory in the traces)."""
    rows, ys = [], []
    kinds = sorted({l.kind for l in table.layers})
    for run in runs:
        trace = run.trace
        if not trace.memory:
            continue
        plan = run.plan
        layers = stage_layers(table, plan)
        step = trace.steps[0]  # the worker samples memory in the first step
        for d in range(plan.devices):
            samples = sorted(trace.memory.get(d, []))[1:]  # the first is the static bytes
            ops = sorted((o for o in step.ops if o.device == d), key=lambda o: o.start)
            if len(samples) != len(ops):
                continue
            levels = [b for _, b in samples]
            for i, op in enumerate(ops):
                if op.kind != "B" or i == 0:
                    continue
                ls = layers[op.stage]
                act = sum(l.act for l in ls)
                act_w = sum(l.act_w for l in ls)
                rise = levels[i] - levels[i - 1]  # the model: -(act - act_w)
                rows.append([sum(1 for l in ls if l.kind == k) for k in kinds])
                ys.append(rise + (act - act_w))
    if not rows:
        return None
    return held_for_w(kinds, np.array(rows, float), np.array(ys, float))


def held_for_w(kinds: list[str], counts: np.ndarray, extra: np.ndarray) -> dict[str, float]:
    """Per kind, the bytes each of its layers holds, by non-negative least squares: `counts`
    has a row per B (its stage's layers of each of `kinds`), `extra` its rise beyond the
    profile's. A kind no row has is left out.

    scipy's BVLS (Stark and Parker's bounded form of Lawson-Hanson), not its nnls: when some
    kinds come in the same proportions in every row (a regular model cut into few stages), many
    splits fit equally well and the two pick different ones. BVLS starts from numpy's
    minimum-norm least squares and picks the split the hand-written Lawson-Hanson it replaced
    did, on every calibration scenario of tests/calibrate and on real traces: the printed
    calibration stays as it was."""
    from scipy.optimize import lsq_linear  # here: half a second to import, and compare does not fit

    coef = lsq_linear(counts, extra, bounds=(0, np.inf), method="bvls").x
    used = enumerate(zip(kinds, coef, strict=True))
    return {k: float(c) for i, (k, c) in used if counts[:, i].any()}
