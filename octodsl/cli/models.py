"""`octodsl models [SPEC | --from-hf PATH] [--json] [--yaml] [--device D] [--zero N --dp N]
[--target deepspeed|megatron] [--tp N [--sequence-parallel true|false]]`: list the built-in
models, or show one model's layer kinds with their analytical costs, the bytes per parameter
the runtime holds and the static bytes (sharded by --zero over --dp copies; with --tp, one GPU's
share of each layer and its tp collectives)."""

from __future__ import annotations

from ..costs.param_bytes import ParamBytes
from ..costs.resolve import cost_table
from ..costs.table import CostTable
from ..errors import OctoError
from ..models import KIND_SYMBOL, LAYER_KINDS, SpecError, builtin_models, load_model
from ..models.builtin import PUBLISHED_PARAMS
from ..models.load import HF_PREFIX
from ..models.spec import ModelSpec
from ..plan import DEEPSPEED, PIPELINE_ZERO, RUNTIME_NAMES, RUNTIMES, Header, plan_runtime
from ..units import size
from .common import (
    DEVICE,
    DEVICE_HELP,
    DP,
    MICROBATCH_SIZE,
    SEQ_LEN,
    TP,
    ZERO,
    UserError,
    mesh_update,
    print_json,
    switch,
    warn_zero_without_copies,
)

_SHORT = {
    "embedding": "emb",
    "mamba2": "mamba2",
    "mamba1": "mamba1",
    "attention": "attn",
    "gated_deltanet": "deltanet",
    "mlp": "mlp",
    "moe": "moe",
    "lm_head_loss": "head",
}


def register(sub) -> None:
    p = sub.add_parser(
        "models", help="list the built-in models, or show one model's layers and analytical costs"
    )
    p.add_argument(
        "spec",
        nargs="?",
        metavar="SPEC",
        help="a built-in name, a spec file (.yaml/.json) or hf:PATH (a Hugging Face "
        "config.json or its folder): show its layer kinds",
    )
    p.add_argument(
        "--from-hf",
        metavar="PATH",
        help="the model of a Hugging Face config.json (or a folder holding one), read "
        "without weights or network; the same as SPEC hf:PATH",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--yaml",
        action="store_true",
        help="print SPEC as a spec file (a starting point for your own model)",
    )
    p.add_argument(
        "--device",
        type=DEVICE,
        default="H800",
        metavar="DEVICE",
        help=f"device for SPEC's analytical costs: {DEVICE_HELP} (default H800)",
    )
    p.add_argument(
        "--microbatch-size", type=MICROBATCH_SIZE, metavar="B", help="override the spec's"
    )
    p.add_argument("--seq-len", type=SEQ_LEN, metavar="S", help="override the spec's")
    p.add_argument(
        "--zero",
        type=ZERO,
        default=0,
        metavar="N",
        help="show SPEC's static bytes under ZeRO stage N (1: optimizer state sharded, "
        "2: gradients too) over --dp copies (default 0)",
    )
    p.add_argument(
        "--dp", type=DP, default=1, metavar="N", help="data-parallel copies for --zero (default 1)"
    )
    p.add_argument(
        "--target",
        choices=RUNTIMES,
        help="the runtime whose bytes per parameter to show: deepspeed (octodsl's executor; "
        "the default), megatron (Megatron-LM; the default at --zero 2)",
    )
    p.add_argument(
        "--tp",
        type=TP,
        default=1,
        metavar="N",
        help="tensor-parallel degree: show one GPU's share of each layer (default 1)",
    )
    p.add_argument(
        "--sequence-parallel",
        type=switch,
        metavar="true|false",
        help="sequence parallelism in the tp group (default: on when --tp > 1)",
    )
    p.set_defaults(func=run)


def _load(args) -> ModelSpec:
    try:
        return load_model(args.spec).with_shape(args.microbatch_size, args.seq_len)
    except SpecError as e:
        raise UserError(str(e)) from None


def run(args) -> int:
    if args.from_hf is not None:
        if args.spec is not None:
            raise UserError("give SPEC or --from-hf, not both")
        args.spec = HF_PREFIX + args.from_hf
    if args.spec is None:
        if args.yaml:
            raise UserError("--yaml needs a SPEC")
        return _list(args.json)
    spec = _load(args)
    if args.yaml:
        import yaml

        print(yaml.safe_dump(spec.compact(), sort_keys=False, width=100), end="")
        return 0
    mesh_update(args, 1, None)  # refuses sequence parallelism at tp 1
    warn_zero_without_copies("--zero", args.zero, args.dp)
    # the runtime a plan of this ZeRO stage names or implies (`plan_runtime`)
    header = Header(name="models", devices=1, microbatches=1, zero=args.zero, runtime=args.target)
    runtime = plan_runtime(header)
    if runtime == DEEPSPEED and args.zero > PIPELINE_ZERO:
        raise UserError(
            f"--zero {args.zero} with --target deepspeed: DeepSpeed's pipeline engine, which "
            f"octodsl's executor runs, takes ZeRO 0 to {PIPELINE_ZERO} only; --target megatron "
            "runs it"
        )
    try:
        table = cost_table(
            model=args.spec,
            device=args.device,
            microbatch_size=args.microbatch_size,
            seq_len=args.seq_len,
            tp=args.tp,
            sp=args.sequence_parallel,
        )
    except OctoError as e:  # a tp the model does not split over
        raise UserError(str(e)) from None
    return _show(spec, table, args.json, args.zero, args.dp, runtime)


def _summary(spec: ModelSpec) -> dict:
    """Name, layer counts by kind and parameter counts: the `--json` entry of a model."""
    return {
        "name": spec.name,
        "num_layers": spec.num_layers,
        "layers": spec.kind_counts(),
        "params": spec.params(),
        "active_params": spec.active_params(),
        "published_params": PUBLISHED_PARAMS.get(spec.name),
        "description": spec.description,
    }


def _billions(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def _list(as_json: bool) -> int:
    specs = [load_model(name) for name in builtin_models()]
    if as_json:
        print_json([_summary(s) for s in specs])
        return 0
    from rich.console import Console
    from rich.table import Table

    kinds = [k for k in LAYER_KINDS if k not in ("embedding", "lm_head_loss")]
    table = Table(title="built-in models (every one also has an embedding and an LM head layer)")
    table.add_column("name")
    table.add_column("layers", justify="right")
    for kind in kinds:
        table.add_column(f"{_SHORT[kind]} {KIND_SYMBOL[kind]}", justify="right")
    for col in ("params", "active", "published"):
        table.add_column(col, justify="right")
    for s in specs:
        counts = s.kind_counts()
        table.add_row(
            s.name,
            str(s.num_layers),
            *(str(counts[k] or "") for k in kinds),
            _billions(s.params()),
            _billions(s.active_params()),
            _billions(PUBLISHED_PARAMS.get(s.name)),
        )
    Console(width=140).print(table)
    return 0


def _param_bytes_json(pb: ParamBytes) -> dict:
    return {"weights": pb.weights, "grads": pb.grads, "optimizer": pb.optimizer, "total": pb.total}


def _per_parameter(pb: ParamBytes) -> str:
    return f"{pb.weights:g} + {pb.grads:g} + {pb.optimizer:g} = {pb.total:g} bytes"


def _show(
    spec: ModelSpec, costs: CostTable, as_json: bool, zero: int, dp: int, runtime: str
) -> int:
    """`costs`: the analytical table of `spec` (at its tp: one GPU's share)."""
    device, tp, sp = costs.meta["device"], costs.meta["tp"], costs.meta["sp"]
    pb = costs.static_bytes(runtime)
    one, mine = pb.sharded(zero, 1), pb.sharded(zero, dp)
    share = pb.share(zero, dp)
    rows: dict[str, dict] = {}
    for layer, cost in zip(spec.layers, costs.layers, strict=True):
        row = rows.setdefault(
            layer.kind,
            {
                "kind": layer.kind,
                "symbol": layer.symbol,
                "count": 0,
                "params": cost.params,
                "f": cost.f,
                "b": cost.b,
                "w": cost.w,
                "act": cost.act,
                "act_w": cost.act_w,
                "sel_act": cost.sel_act,
                "sel_f": cost.sel_f,
                "static": share * cost.static,
                "tp_f": cost.tp_f,
                "tp_b": cost.tp_b,
                "tp_w": cost.tp_w,
            },
        )
        row["count"] += 1
    nominal = sum(layer.static for layer in costs.layers)
    static, per_copy = pb.share(zero, 1) * nominal, share * nominal
    if as_json:
        print_json(
            {
                **_summary(spec),
                "pattern": spec.pattern,
                "device": device,
                "microbatch_size": spec.microbatch_size,
                "seq_len": spec.seq_len,
                "runtime": runtime,
                "param_bytes": _param_bytes_json(one),
                "zero": zero,
                "dp": dp,
                "tp": tp,
                "sequence_parallel": sp,
                "param_bytes_per_device": _param_bytes_json(mine),
                "static": static,
                "static_per_device": per_copy,
                "kinds": list(rows.values()),
            }
        )
        return 0
    from rich.console import Console
    from rich.table import Table

    on = (
        f" at tp {tp}{' with' if sp else ' without'} sequence parallelism, one GPU's share"
        if tp > 1
        else ""
    )
    table = Table(
        title=f"{spec.name}: {spec.num_layers} layers, {_billions(spec.params())} "
        f"parameters; analytical costs on {device}{on}, micro-batch "
        f"{spec.microbatch_size} x {spec.seq_len} tokens, {spec.dtype}"
    )
    sharded = mine != one
    for col in (
        "kind",
        "sym",
        "count",
        "params",
        "F ms",
        "B ms",
        "W ms",
        *(("tp comm ms",) if tp > 1 else ()),
        "act MiB",
        "act_w MiB",
        "sel MiB",
        "static MiB" + (" / copy" if sharded else ""),
    ):
        table.add_column(col, justify="left" if col in ("kind", "sym") else "right")
    for r in rows.values():
        comm = (f"{(r['tp_f'] + r['tp_b'] + r['tp_w']) * 1e3:.3f}",) if tp > 1 else ()
        table.add_row(
            r["kind"],
            r["symbol"],
            str(r["count"]),
            _billions(r["params"]),
            f"{r['f'] * 1e3:.3f}",
            f"{r['b'] * 1e3:.3f}",
            f"{r['w'] * 1e3:.3f}",
            *comm,
            f"{r['act'] / 2**20:.1f}",
            f"{r['act_w'] / 2**20:.1f}",
            f"{r['sel_act'] / 2**20:.1f}",
            f"{r['static'] / 2**20:,.1f}",
        )
    console = Console(width=140)
    console.print(table)
    console.print(f"pattern {spec.pattern}", soft_wrap=True, highlight=False, markup=False)
    line = (
        f"per parameter, as {RUNTIME_NAMES[runtime]} holds them: weights + gradients + "
        f"optimizer state = {_per_parameter(one)}; "
        f"static {size(static, 2)} for the whole model"
        + (f" (one GPU's share at tp {tp})" if tp > 1 else "")
    )
    if sharded:
        line += (
            f"; on one of {dp} copies with ZeRO {zero}: {_per_parameter(mine)}, "
            f"static {size(per_copy, 2)}"
        )
    console.print(line, soft_wrap=True, highlight=False, markup=False)
    console.print(
        "sel: the activation bytes selective recompute drops after F, per layer"
        + ("; tp comm: of F + B + W, the tp collectives' seconds" if tp > 1 else ""),
        highlight=False,
        markup=False,
    )
    return 0
