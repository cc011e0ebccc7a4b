"""The one way the simulator, tuner and CLI obtain a cost table: from a profile, or from the
analytical model of a model spec on a device."""

from __future__ import annotations

from dataclasses import replace

from ..errors import OctoError
from ..mesh import Mesh
from ..models import load_model
from ..models.ep import experts_problem
from ..models.tp import tp_problems
from ..plan import Header
from .analytical import analytical_costs
from .devices import builtin_device, get_device, get_link
from .expert import EpLinks
from .profile import ProfileError, read_profile
from .table import CostTable, Link

_SHAPE_FIELDS = {"name", "description", "microbatch_size", "seq_len"}


def cost_table(
    model: str | None = None,
    profile: str | None = None,
    device: str = "H800",
    microbatch_size: int | None = None,
    seq_len: int | None = None,
    tp: int = 1,
    sp: bool | None = None,
    tp_link: Link | None = None,
    overlap_tp: bool = False,
    scatter_gather: bool = False,
    ep: int = 1,
    ep_node_ranks: int | None = None,
    inter_link: Link | None = None,
) -> CostTable:
    """Per-layer costs for a plan.

    With `profile` (a path), the measured costs; `model`, when also given, must be the profiled
    model, and a micro-batch size or sequence length, when given, must be the profiled one (a
    profile is not rescaled). Otherwise the analytical costs of `model` (built-in name or spec
    path) on `device` (a built-in's name or a device file's path: the table's meta "device"
    keeps it), at the spec's shape with `microbatch_size` / `seq_len`
    (from the plan header) overriding it, on one GPU of a `tp` group (`sp`: sequence
    parallelism, default on when tp > 1; the collectives on `tp_link`, default the device's node
    link; `overlap_tp`: hidden under the GEMMs, the plan's `overlap_tp_comm`; `scatter_gather`:
    the plan's `scatter_gather_messages`). The MoE layers' experts spread over an `ep` group
    (the plan's `ep`) of which `ep_node_ranks` share a node (default all: `Mesh.ep_ranks_per_node`):
    its all-to-alls take the tp link inside a node and `inter_link` (default the device's
    inter-node link) between nodes. A profile is measured at tp 1 and ep 1: more with a profile
    is refused.

    Raises ValueError (SpecError, ProfileError) with a message for the user."""
    if profile is not None:
        if ep > 1:
            raise ProfileError(
                f"profile {profile} was measured without expert parallelism (ep 1); a plan at "
                f"ep {ep} needs the analytical costs (--model)"
            )
        if tp > 1:
            raise ProfileError(
                f"profile {profile} was measured on single GPUs (tp 1); a plan at "
                f"tp {tp} needs the analytical costs (--model) until profiles "
                "measure tensor-parallel layers"
            )
        prof = read_profile(profile)
        measured = prof.model
        if model is not None:
            spec = load_model(model)
            if spec.model_dump(exclude=_SHAPE_FIELDS) != measured.model_dump(exclude=_SHAPE_FIELDS):
                raise ProfileError(
                    f"profile {profile} measured {measured.name} "
                    f"({measured.pattern}), not the plan's model {model}"
                )
        for what, want, got in (
            ("micro-batch size", microbatch_size, measured.microbatch_size),
            ("sequence length", seq_len, measured.seq_len),
        ):
            if want is not None and want != got:
                raise ProfileError(
                    f"profile {profile} was measured at {what} {got}, the plan asks "
                    f"for {want}; profile again with that {what}"
                )
        return prof.cost_table(profile)
    if model is None:
        raise OctoError("costs need a model (built-in name or spec file) or a profile")
    spec = load_model(model).with_shape(microbatch_size, seq_len)
    fatal = [p.message for p in tp_problems(spec, tp) if p.fatal]
    if fatal:
        raise OctoError(f"{spec.name} does not split over tp {tp}: {'; '.join(fatal)}")
    why = experts_problem(spec, ep)
    if why is not None:
        raise OctoError(why)
    dev = get_device(device)
    node = tp_link or get_link(dev.node_link)
    table = analytical_costs(
        spec,
        dev,
        tp=tp,
        sp=sp,
        tp_link=tp_link,
        overlap_tp=overlap_tp,
        scatter_gather=scatter_gather,
        ep=ep,
        ep_links=EpLinks(
            node,
            inter_link or get_link(dev.inter_node_link),
            ep if ep_node_ranks is None else ep_node_ranks,
        ),
    )
    if builtin_device(device) is None:  # a device file: its path, which resolves to it again
        table = replace(table, meta={**table.meta, "device": device})
    return table


def header_costing(h: Header) -> dict:
    """The `cost_table` arguments a plan's header decides: the micro-batch's shape, tp and
    sequence parallelism, expert parallelism and where its group sits (octodsl.mesh), and the
    runtime fields that change per-layer costs."""
    return {
        "microbatch_size": h.microbatch_size,
        "seq_len": h.seq_len,
        "tp": h.tp,
        "sp": h.sp,
        "overlap_tp": h.overlap_tp_comm,
        "scatter_gather": h.scatter_gather_messages,
        "ep": h.ep,
        "ep_node_ranks": Mesh.of(h).ep_ranks_per_node,
    }
