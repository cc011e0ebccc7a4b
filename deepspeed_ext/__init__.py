"""Run any linted plan with the DeepSpeed launcher (`octodsl.deepspeed_ext`).

    engine, optimizer, _, scheduler = octodsl.deepspeed_ext.initialize(
        layer_specs, "plan.octo", config="ds_config.json", loss_fn=lm_loss)
    loss = engine.train_batch(data_iter)

Modules, one job each: launch (the entry point and the plan-vs-launch checks), config (the
DeepSpeed config's "octo" section and batch sizes), partition (layers per stage), module
(several stages per rank), program (the plan's DAG compiled into one rank's instructions), p2p
(message streams between any two ranks), engine (DeepSpeed's PipelineEngine running the
program; B and W by octodsl.layers.split_backward), lanes (an overlap group's ops at once),
checkpoint (saves and loads checked on every rank), watchdog (hangs and lost peers),
distributed (init_distributed, released_groups, shutdown);
Chrome traces are written in octodsl.trace's format.
"""

from .errors import CheckpointError, PlanLaunchError

__all__ = [
    "CheckpointError",
    "PlanLaunchError",
    "check_launch",
    "init_distributed",
    "initialize",
    "released_groups",
    "shutdown",
]


def __getattr__(name: str):
    # DeepSpeed is imported on first use, so that importing the package (PlanLaunchError)
    # does not pay for it.
    if name in ("check_launch", "initialize"):
        from . import launch

        return getattr(launch, name)
    if name in ("init_distributed", "released_groups", "shutdown"):
        from . import distributed

        return getattr(distributed, name)
    raise AttributeError(name)
