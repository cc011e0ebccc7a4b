"""What every export to another trainer needs of a plan: its model's layers cut into stages, the
generated schedule its order may equal, and the error for a plan the target cannot express.

The trainers' outputs (megatron.py, deepspeed_out.py) are text for the user; what they lose or
change of the plan is said twice, as a comment in that text and as a warning on the terminal
(`Export.warnings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import OctoError
from ..gen import phased_schedule
from ..models import load_model
from ..models.spec import ModelSpec
from ..plan import Plan


class ExportError(OctoError):
    """A valid plan the target trainer cannot run as written; the message says why and what
    would fit (exit 1, as for any request that cannot be met)."""

    exit_code = 1


@dataclass(slots=True)
class Export:
    """A plan in another trainer's terms."""

    text: str
    """What to give the trainer (arguments, a Python snippet)."""
    warnings: list[str] = field(default_factory=list)
    """What of the plan the trainer runs otherwise or not at all, one sentence each."""


@dataclass(frozen=True, slots=True)
class Cuts:
    """A plan's model and the layers of each of its stages."""

    spec: ModelSpec
    symbols: list[str]
    """symbols[s]: stage s's layers as pattern symbols (`[` embedding ... `]` LM head)."""

    @property
    def parts(self) -> list[int]:
        """DeepSpeed's form: stage s holds layers parts[s] to parts[s + 1] - 1."""
        out = [0]
        for s in self.symbols:
            out.append(out[-1] + len(s))
        return out


def plan_cuts(plan: Plan, target: str) -> Cuts:
    """The plan's model and its stages' layers; an ExportError for a plan with no model or with
    abstract stages (`stages N`), since `target` needs the cuts."""
    if plan.header.model is None:
        raise ExportError(
            f"the plan names no model: {target} needs the model's layers and where "
            'the plan cuts them (add `model "NAME"` and a partition of its layers, '
            "e.g. with `octodsl gen ... --model NAME`)"
        )
    if any(s.abstract for s in plan.stages):
        raise ExportError(
            f"the plan's stages name no layers (`stages {plan.num_stages}`): "
            f"{target} needs the cuts; write the partition as layers or a pattern "
            f"(`octodsl gen ... --model {plan.header.model}` cuts it by cost)"
        )
    spec = load_model(plan.header.model)
    pattern = spec.pattern
    return Cuts(spec, [pattern[s.bounds[0] : s.bounds[1] + 1] for s in plan.stages])


def is_generated(plan: Plan, schedule: str, chunks: int | None = None) -> bool:
    """Whether the plan's orders are exactly those `octodsl gen SCHEDULE` writes for its devices
    and micro-batches (overlap groups and op kinds included)."""
    try:
        phased = phased_schedule(schedule, plan.devices, plan.microbatches, chunks)
    except OctoError:
        return False
    return phased.orders()[0] == plan.schedule


def looped_chunks(plan: Plan) -> int | None:
    """V when the plan places stage s on device s mod P with V stages per device (a 1F1B or
    interleaved placement); None for any other placement."""
    P = plan.devices
    if plan.num_stages % P or plan.stage_device() != [s % P for s in range(plan.num_stages)]:
        return None
    return plan.num_stages // P


def placement_problem(plan: Plan) -> str:
    """Why the plan's placement is not looped (stage s on device s mod P), in its own terms."""
    P, home = plan.devices, plan.stage_device()
    if plan.num_stages == 2 * P and home == [s if s < P else 2 * P - 1 - s for s in range(2 * P)]:
        return (
            f"its placement is a V (device d holds stages d and {2 * P - 1} - d), which "
            "runs back up the devices"
        )
    if plan.num_stages % P:
        return f"its {plan.num_stages} stages do not divide evenly over its {P} devices"
    s = next(s for s in range(plan.num_stages) if home[s] != s % P)
    return f"it puts stage {s} on device {home[s]}, not on device {s % P} (stage mod devices)"
