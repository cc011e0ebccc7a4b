"""Which runtime runs a configuration: `tune --gpus --target` proposes only what its target
runs (docs/cluster.md, "Targets")."""

from __future__ import annotations

from ...plan import MEGATRON, PIPELINE_ZERO, RUNTIMES

EXECUTOR_ZERO = PIPELINE_ZERO
"""The highest ZeRO stage octodsl's executor runs, the one value its ds_config check uses."""


def runtimes(zero: int) -> tuple[str, ...]:
    """The targets that run a configuration of this ZeRO stage: Megatron's distributed optimizer
    reduce-scatters gradients in a pipeline too (`zero 2`; its gradient buffer stays whole:
    octodsl.costs.param_bytes), octodsl's executor does not."""
    return RUNTIMES if zero <= EXECUTOR_ZERO else (MEGATRON,)


def admits(target: str, zero: int) -> bool:
    return target in runtimes(zero)


def refusal(target: str, zero: int) -> str | None:
    """Why `--zero` fixed to `zero` rules out every configuration of `target`, or None."""
    if admits(target, zero):
        return None
    return (
        f"--zero {zero} rules out every configuration of --target {target}: octodsl's "
        f"executor (deepspeed_ext, on DeepSpeed's pipeline engine) runs ZeRO 0 to "
        f"{EXECUTOR_ZERO} only; --target {MEGATRON} admits it (Megatron's distributed "
        "optimizer shards gradients in a pipeline)"
    )
