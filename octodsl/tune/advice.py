"""What a `Problem` (tune/problem.py) tells the user when no plan can fit its memory limit:
the cause, and the levers not pulled yet that would make room (ZeRO over more copies,
recompute, a larger tp)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from ..errors import OctoError
from ..plan import DEEPSPEED, PIPELINE_ZERO, Recompute, plan_runtime
from ..units import size
from .bounds import least_kept
from .problem import AUTO, Problem


def why_no_plan_fits(problem: Problem, advice: bool = True) -> str | None:
    """Why no partition can fit the memory limit, for the user; None when some may. A
    device holds its layers' static bytes (ZeRO-sharded) all the time and, while its
    deepest stage runs the first micro-batch, what that micro-batch keeps of all its layers
    (`least_kept()`), and while a stage's B runs all of its activations: so the static
    bytes, what one micro-batch keeps of all layers and the most any layer brings back must
    fit in all the devices' memory together, and each layer's static bytes and activations
    in one device's. (memory_lower_bound() is finite whenever this is None.) With `advice`
    the message goes on to name the levers that would make room (`_levers_hint`) and, for
    all layers, the devices that would; without, it is the cause alone (for a caller that
    gives its own advice, as `tune --gpus` names GPUs)."""
    short = static_room(problem)
    if short is None:
        return None
    limit = problem.memory
    assert limit is not None, "only a memory limit leaves no room"
    layers = problem.table.layers
    P = problem.devices
    total, need, layer = short
    if layer is None:
        cause = (
            f"no plan fits in {size(limit)} per device: on {P} devices the parameters, "
            f"gradients and optimizer state take {size(total / P)} per device "
            f"({sharding(problem)}) and one micro-batch's activations "
            f"{size(need / P)} more{recompute_note(problem)}"
        )
        return (
            cause
            if not advice
            else (
                cause
                + "; use "
                + levers_hint(problem, need, limit)
                + f"at least {math.ceil((total + need) / limit)} devices, a larger memory "
                "limit or smaller micro-batches"
            )
        )
    cause = (
        f"no plan fits in {size(limit)} per device: layer {layer} ({layers[layer].kind}) "
        f"alone holds {size(total + need)} with one micro-batch's "
        f"activations ({sharding(problem)})"
    )
    return (
        cause
        if not advice
        else (
            cause
            + "; use "
            + levers_hint(problem, need, limit, layer=layer)
            + "a larger memory limit or smaller micro-batches"
        )
    )


def static_room(problem: Problem) -> tuple[float, float, int | None] | None:
    """None when why_no_plan_fits() finds room; else (static bytes, activation bytes, None)
    of all the layers when they overflow all the devices, or (static, activations, i) of
    a layer i that overflows one device."""
    limit = problem.memory
    if limit is None:
        return None
    static = problem.layer_static()
    act = np.array([l.act for l in problem.table.layers], float)
    kept = least_kept(problem)
    need = float(kept.sum() + (act - kept).max())
    total = float(static.sum())
    if total + need > problem.devices * limit:
        return total, need, None
    i = int(np.argmax(static + act))
    if static[i] + act[i] > limit:
        return float(static[i]), float(act[i]), i
    return None


def sharding(problem: Problem) -> str:
    """'zero 1, dp 8' (and ', tp 4' at tp > 1): the levers the static bytes are split by."""
    h = problem.header
    return f"zero {h.zero}, dp {h.dp}" + (f", tp {h.tp}" if h.tp > 1 else "")


def recompute_note(problem: Problem) -> str:
    if problem.recompute == AUTO:
        return " even with recompute"
    return "" if problem.recompute == Recompute.NONE else f" with {problem.recompute} recompute"


def levers_hint(problem: Problem, need: float, limit: int, layer: int | None = None) -> str:
    """The memory levers not pulled yet that would leave room: ZeRO over enough copies,
    recompute, a larger tp; '' when none would."""
    h = problem.header
    raw = np.array([l.static for l in problem.table.layers], float)
    fits = (
        (lambda share: share * raw[layer] + need <= limit)
        if layer is not None
        else (lambda share: share * float(raw.sum()) + need <= problem.devices * limit)
    )
    hints = []
    for zero in (1, 2):
        if zero <= h.zero or (zero > PIPELINE_ZERO and h.runtime == DEEPSPEED):
            continue
        # as the runtime would hold them at that stage (zero 2 is Megatron's: plan_runtime)
        pb = problem.table.static_bytes(
            plan_runtime(h.model_copy(update={"zero": zero})), h.grad_accum_dtype
        )
        dp = next(
            (d for d in (max(h.dp, 2), 4, 8, 16, 32, 64) if d >= h.dp and fits(pb.share(zero, d))),
            None,
        )
        if dp is not None:
            per = pb.share(zero, dp) * (
                float(raw[layer]) if layer is not None else float(raw.sum()) / problem.devices
            )
            hints.append(
                f"ZeRO (`--zero {zero} --dp {dp}` leaves {size(per)} static per "
                f"{'device' if layer is None else 'layer'}, more copies less)"
            )
            break
    if problem.recompute != AUTO and layer is None:
        hints.append("recompute (`--recompute auto`)")
    tp = tp_that_fits(problem)
    if tp is not None:
        hints.append(f"tensor parallelism (`--tp {tp}` splits every layer over {tp} GPUs)")
    return "".join(h + ", " for h in hints)


def tp_that_fits(problem: Problem) -> int | None:
    """The smallest of `larger_tps()` at which why_no_plan_fits() finds nothing; None if
    none."""
    return next((tp for tp, other in larger_tps(problem) if static_room(other) is None), None)


def larger_tps(problem: Problem) -> Iterator[tuple[int, Problem]]:
    """Each tp above the header's that keeps a tp group in a node (divides gpus_per_node)
    and that the model splits over, smallest first, with this problem at that tp (none for
    costs that are not a built-in device's analytical ones)."""
    h = problem.header
    if h.model is None or "device" not in problem.table.meta or problem.table.meta.get("profile"):
        return
    for tp in range(h.tp + 1, h.gpus_per_node + 1):
        if h.gpus_per_node % tp:
            continue
        try:
            yield tp, problem.at_tp(tp)
        except OctoError:  # the model does not split over this tp
            continue
