"""`gen --model`: cut a model's layers (embedding and LM head included, in spec order) into the
schedule's stages."""

from __future__ import annotations

from ..costs.resolve import cost_table
from ..errors import OctoError
from ..models import load_model
from ..partition import balance_parameters, balance_time, equal_layers, megatron_layers
from ..plan import Stage

METHODS = ("time", "parameters", "equal", "megatron", "megatron-ends")


def model_stages(
    model: str,
    num_stages: int,
    method: str = "time",
    device: str = "H800",
    profile: str | None = None,
    microbatch_size: int | None = None,
    seq_len: int | None = None,
    tp: int = 1,
    sp: bool | None = None,
    ep: int = 1,
) -> tuple[list[Stage], str]:
    """The stages (layer ranges, with the model's pattern symbols so the plan shows each
    stage's layer kinds) and one line saying how they were cut, the costs being one GPU's of a
    `tp` group and an `ep` group (`cost_table`; its all-to-alls inside a node, which scales
    every MoE layer alike). Raises an OctoError with a message for the user."""
    if method not in METHODS:
        raise OctoError(f"unknown partition method '{method}'; methods are {', '.join(METHODS)}")
    pattern = load_model(model).pattern
    if len(pattern) < num_stages:
        raise OctoError(f"{model} has {len(pattern)} layers, too few for {num_stages} stages")
    if method == "equal":
        ranges = equal_layers(len(pattern), num_stages)
        note = "equal layer counts (DeepSpeed's 'uniform')"
    elif method in ("megatron", "megatron-ends"):
        ranges = megatron_layers(pattern, num_stages, ends=method == "megatron-ends")
        note = "Megatron-LM's split: equal transformer layers, embedding first, LM head last" + (
            ", each counted as a layer" if method == "megatron-ends" else ""
        )
    else:
        table = cost_table(
            model=model,
            profile=profile,
            device=device,
            microbatch_size=microbatch_size,
            seq_len=seq_len,
            tp=tp,
            sp=sp,
            ep=ep,
        )
        if method == "parameters":
            ranges = balance_parameters([layer.params for layer in table.layers], num_stages)
            note = "balanced parameter counts (DeepSpeed's 'parameters')"
        else:
            work = [layer.f + layer.b + layer.w for layer in table.layers]
            ranges = balance_time(work, num_stages)
            times = [sum(work[a : b + 1]) * 1e3 for a, b in ranges]
            note = (
                f"balanced F+B+W time ({table.source}): {min(times):.2f} to "
                f"{max(times):.2f} ms per micro-batch and stage"
            )
    return [Stage(a, b, pattern[a : b + 1]) for a, b in ranges], note
