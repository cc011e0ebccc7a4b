"""`initialize`: `deepspeed.initialize` for a plan. The user's script builds its model as a list of
DeepSpeed `LayerSpec`s (as for a `PipelineModule`) and calls this instead; `engine.train_batch()`
then runs the plan.

The plan comes from the `plan` argument (a Plan, or the path of a .octo file) or else from the
DeepSpeed config's `"octo"` section (config.py):

    "octo": {"schedule": "plan.octo", "timeout": 300, "trace": false}

`timeout` is the watchdog's limit on one wait (seconds); `trace` records per-op times for
`engine.write_trace(path)`. The batch sizes and the ZeRO stage are the plan's
(`config.plan_config`); everything else in the config is DeepSpeed's, unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ..lang import PlanSyntaxError, load_plan
from ..lint import lint_plan
from ..mesh import Mesh
from ..models.ep import split_experts_problem
from ..models.spec import LayerConfig, MoEConfig
from ..models.tp import layer_problems
from ..plan import Plan
from .config import octo_section, plan_config, read_config
from .distributed import init_distributed
from .engine import OctoPipeEngine
from .errors import PlanLaunchError
from .module import OctoPipeModule, layer_name
from .partition import describe_split, stage_layers


def initialize(
    layers: Sequence,
    plan: Plan | str | Path | None = None,
    *,
    config: dict | str | Path,
    loss_fn: Callable | None = None,
    args=None,
    optimizer=None,
    model_parameters=None,
    training_data=None,
    lr_scheduler=None,
    collate_fn=None,
    layer_costs: Sequence[float] | None = None,
    microbatch_size: int | None = None,
    octo: dict | None = None,
    **module_kwargs,
):
    """Build the pipeline module and engine for `plan`; returns DeepSpeed's
    (engine, optimizer, training_dataloader, lr_scheduler).

    `layers`: the model as LayerSpecs / modules in order (a stage runs the plan's layers of
    them). `config`: the DeepSpeed config (a dict or a JSON file); its batch sizes may be left
    out, and those it gives must be the plan's. `layer_costs`: per-layer costs (F + B + W) used
    to split the layers over the stages of a plan that names no layers. `microbatch_size`:
    sequences per micro-batch when the plan states none (the model's default). `octo`: fields
    that override the config's "octo" section. `module_kwargs` go to DeepSpeed's PipelineModule
    (e.g. `seed_layers`, `base_seed`, `activation_checkpoint_interval`).

    Raises PlanLaunchError, on every rank and before any pipeline communication, when the plan
    does not lint clean or does not fit the launch, or the config's "octo" section or batch
    sizes are wrong."""
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    from .mesh import topology

    config_name = str(config) if isinstance(config, (str, Path)) else None
    config, section = read_config(config)
    if octo:
        section = octo_section({**section.model_dump(exclude_none=True), **octo}, config_name)
    if plan is None:
        if section.schedule is None:
            raise PlanLaunchError(
                'no plan: pass plan=... or set "octo": {"schedule": "plan.octo"} '
                "in the DeepSpeed config"
            )
        plan = section.schedule
    names = {"plan_name": None if isinstance(plan, Plan) else str(plan), "config_name": config_name}
    if not isinstance(plan, Plan):
        plan = _read_plan(plan)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ranges = check_launch(plan, world, config, layers, layer_costs, microbatch_size, **names)
    config = plan_config(config, plan, microbatch_size, **names)
    if all(st.abstract for st in plan.stages) and os.environ.get("RANK", "0") == "0":
        assert layer_costs is not None, "check_launch refuses a plan without layers or costs"
        print(
            "octodsl: the plan names no layers; the model's layers split over its stages by cost "
            "(octodsl.partition.plan_partition, as `octodsl simulate` splits them):\n"
            + describe_split(ranges, [layer_name(spec) for spec in layers], layer_costs),
            flush=True,
        )

    init_distributed()
    module = OctoPipeModule(
        layers, plan, ranges, loss_fn=loss_fn, topology=topology(plan), **module_kwargs
    )
    mpu = module.mpu()
    config_class = DeepSpeedConfig(config, mpu)
    deepspeed.set_optimizer_flags(config_class, module)
    if model_parameters is None:
        model_parameters = [p for p in module.parameters() if p.requires_grad]
    engine = OctoPipeEngine(
        plan=plan,
        timeout=section.wait_seconds,
        trace=section.trace,
        args=args,
        model=module,
        optimizer=optimizer,
        model_parameters=model_parameters,
        training_data=training_data,
        lr_scheduler=lr_scheduler,
        mpu=mpu,
        dist_init_required=False,
        collate_fn=collate_fn,
        config=config,
        config_class=config_class,
    )
    assert dist.get_world_size() == world
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _read_plan(path: str | Path) -> Plan:
    try:
        return load_plan(path)
    except OSError as e:
        raise PlanLaunchError(f"cannot read the plan: {e.strerror or e}", path=str(path)) from None
    except PlanSyntaxError as e:
        raise PlanLaunchError(e.render()) from None


def check_launch(
    plan: Plan,
    world: int,
    config: dict,
    layers: Sequence | int,
    layer_costs: Sequence[float] | None = None,
    microbatch_size: int | None = None,
    *,
    plan_name: str | None = None,
    config_name: str | None = None,
) -> list[range]:
    """The layers of each stage, once the plan is known to lint clean and to fit a launch of
    `world` processes (tp x devices x dp) with this DeepSpeed config (its batch sizes and ZeRO
    stage: `config.plan_config`) and the model's `layers` (its LayerSpecs, or their number),
    whose layers the plan's tp can split (`octodsl.models.tp`) and whose experts its ep can
    (`octodsl.models.ep`)."""
    errors = [d for d in lint_plan(plan) if d.is_error]
    if errors:
        raise PlanLaunchError(
            "the plan does not lint clean:\n"
            + "\n".join(f"  {d.code}: {d.message}" for d in errors)
        )
    idle = [d for d, stages in enumerate(plan.device_stages()) if not stages]
    if idle:
        raise PlanLaunchError(
            f"device(s) {', '.join(map(str, idle))} hold no stage; every process of "
            "the pipeline must run one"
        )
    _check_world(plan, world)
    _check_tp(plan, layers)
    _check_ep(plan, layers)
    plan_config(config, plan, microbatch_size, plan_name=plan_name, config_name=config_name)
    return stage_layers(plan, layers if isinstance(layers, int) else len(layers), layer_costs)


def _check_world(plan: Plan, world: int) -> None:
    """The launch has the plan's tp x devices x dp processes; else what would make it fit."""
    tp, devices, dp = plan.header.tp, plan.devices, plan.header.dp
    needed = Mesh.of(plan.header).world
    if world == needed:
        return
    mesh = f"{dp} data-parallel cop{'y' if dp == 1 else 'ies'} of a {devices}-device pipeline" + (
        f" of tp groups of {tp}" if tp > 1 else ""
    )
    fixes = []
    if world % (tp * devices) == 0:
        fixes.append(f"`dp {world // (tp * devices)}`")
    if world % (devices * dp) == 0 and world // (devices * dp) != tp:
        fixes.append(f"`tp {world // (devices * dp)}`")
    raise PlanLaunchError(
        f"the plan runs {mesh} ({needed} processes"
        + (f": tp {tp} x {devices} devices x dp {dp}" if tp > 1 else "")
        + f"), but the job has "
        f"{world} processes"
        + (f"; to fit it set {' or '.join(fixes)} in the plan header" if fixes else "")
    )


def _layer_configs(layers: Sequence) -> list[LayerConfig]:
    """The configs the model's LayerSpecs are built from (as `octodsl.layers.pipeline_specs`
    makes them)."""
    return [
        arg
        for spec in layers
        for arg in getattr(spec, "module_args", ())
        if isinstance(arg, LayerConfig)
    ]


def _check_tp(plan: Plan, layers: Sequence | int) -> None:
    """Refuse a tp the model's layers cannot be split by (octodsl.models.tp: what each layer
    kind splits)."""
    tp = plan.header.tp
    if tp == 1 or isinstance(layers, int):
        return
    problems: dict[str, None] = {}
    for config in _layer_configs(layers):
        problems.update((p.message, None) for p in layer_problems(config, tp) if p.fatal)
    if problems:
        raise PlanLaunchError(
            f"the model's layers cannot be split over tp {tp}: "
            + "; ".join(problems)
            + " (choose a tp that divides them)"
        )


def _check_ep(plan: Plan, layers: Sequence | int) -> None:
    """Refuse an ep that does not divide the expert count of every MoE layer
    (octodsl.models.ep), or meets a model without MoE layers; lint has checked that it divides
    dp. Layers not built from a LayerConfig (a user's own) are theirs to judge, as for tp."""
    ep = plan.header.ep
    configs = [] if ep == 1 or isinstance(layers, int) else _layer_configs(layers)
    if not configs:
        return
    moes = [c for c in configs if isinstance(c, MoEConfig)]
    if not moes:
        raise PlanLaunchError(
            f"the plan runs ep {ep}, but the model has no MoE layers: there are no experts to "
            "spread (drop `ep`)"
        )
    problem = split_experts_problem(moes, ep, "the model's")
    if problem:
        raise PlanLaunchError(problem)
