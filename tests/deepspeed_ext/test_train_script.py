"""examples/train.py without a launch: its mistakes are one line on rank 0, found before any
communication; it trains the micro-batch shape and (for a plan that names no layers) the split
that `octodsl simulate` costs for the same plan."""

from __future__ import annotations

import importlib
import json
import os
import sys

import pytest
import torch
import torch.distributed as dist

from octodsl.costs.resolve import cost_table
from octodsl.deepspeed_ext.config import batch_config
from octodsl.deepspeed_ext.partition import default_layer_costs, stage_layers
from octodsl.gen import generate, generate_text
from octodsl.interop import read_csv, write_csv
from octodsl.models import load_model
from octodsl.sim import SimCosts

from ..conftest import REPO

sys.path.insert(0, str(REPO / "examples"))
_accelerator = os.environ.get("DS_ACCELERATOR")
train = importlib.import_module("train")
if _accelerator is None:  # train.py chooses the CPU for its own process, not for the test session
    del os.environ["DS_ACCELERATOR"]


@pytest.fixture
def files(tmp_path, monkeypatch):
    """Writes a one-device plan (this process is the whole job) and a DeepSpeed config."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    # what train.py sets for its own process, not for the test session
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)

    def write(plan_text=None, **config):
        plan = tmp_path / "plan.octo"
        plan.write_text(
            plan_text or generate_text("1f1b", devices=1, microbatches=2, model="nemotron-h-tiny")
        )
        ds = tmp_path / "ds.json"
        ds.write_text(
            json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, **config})
        )
        return ["--deepspeed_config", str(ds), "--schedule", str(plan)]

    return write


def _wide_model(tmp_path) -> str:
    """nemotron-h-tiny with 1000 layers (embedding and head included)."""
    spec = load_model("nemotron-h-tiny").compact()
    spec.update(name="wide", pattern="[" + "M-" * 498 + "M*]")
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.parametrize(
    "extra,config,message",
    [
        (
            [],
            {"octo": {"timeout": -1}},
            'ds.json: "octo": timeout: input should be greater than 0, not -1',
        ),
        (
            [],
            {"octo": {"timeout": 1e9}},
            'ds.json: "octo": timeout: input should be less than or equal',
        ),
        (
            [],
            {"train_micro_batch_size_per_gpu": 1},
            "plan.octo trains micro-batches of 2 sequences (it states no microbatch_size: the model's "
            "default), but ",
        ),
        ([], {"gradient_accumulation_steps": 8}, "plan.octo runs 2 micro-batches per step, but "),
        (["--steps", "-1"], {}, "argument --steps: must be at least 0"),
        (["--steps", "1e9"], {}, "argument --steps: '1e9' is not a whole number"),
        (
            ["--seed", str(2**32)],
            {},
            "argument --seed: must be at most 4,294,967,295 (octodsl's limit)",
        ),
        (["--stock", "--save", "ck"], {}, "--trace, --save and --load need the octodsl executor"),
        (["--model", "no-such-model"], {}, "no built-in model or spec file 'no-such-model'"),
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
    ],
)
def test_a_mistake_is_one_line_before_any_communication(files, capsys, extra, config, message):
    assert train.main(files(**config) + extra) == 2
    out, err = capsys.readouterr()
    assert err.startswith("train.py: error: ") and err.count("\n") == 1 and message in err, err
    assert out == "" and not dist.is_initialized()


def test_only_rank_0_says_it(files, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert train.main(files(octo={"timeout": None, "trace": 1})) == 2
    assert capsys.readouterr() == ("", "")


def test_a_partition_over_fewer_layers_than_the_model_is_refused(files, capsys, tmp_path):
    # the plan covers nemotron-h-tiny's 24 layers; --model has 1000
    assert train.main(files() + ["--model", _wide_model(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "train.py: error: the plan's partition covers 24 layers "
        "(0..23), but the model has 1000 (0..999)\n"
    )


SHAPED = [
    ({}, (2, 256)),
    ({"microbatch_size": 1}, (1, 256)),
    ({"seq_len": 64}, (2, 64)),
    ({"microbatch_size": 3, "seq_len": 32}, (3, 32)),
]


@pytest.mark.parametrize("shape,expect", SHAPED)
def test_the_executor_trains_the_shape_simulate_costs(shape, expect):
    plan = generate("1f1b", devices=2, microbatches=4, model="nemotron-h-tiny", **shape)
    spec = train.model_spec(plan, None)
    table = cost_table(
        model=plan.header.model,
        microbatch_size=plan.header.microbatch_size,
        seq_len=plan.header.seq_len,
    )  # what `octodsl simulate` takes
    assert (spec.microbatch_size, spec.seq_len) == expect
    assert (table.meta["microbatch_size"], table.meta["seq_len"]) == expect
    assert spec.tokens == table.tokens_per_microbatch
    config = batch_config({}, plan, spec.microbatch_size)
    assert config["train_micro_batch_size_per_gpu"] == table.meta["microbatch_size"]


def _abstract_plans():
    return {
        "1f1b-p2": generate("1f1b", devices=2, microbatches=4),
        "zb-v-p2": generate("zb-v", devices=2, microbatches=4),
        "interleaved-p4": generate("interleaved", devices=4, microbatches=8, chunks=2),
        "torch-csv": read_csv(
            write_csv(generate("zb-h1", devices=3, microbatches=6)), "schedule.csv"
        )[0],
    }


@pytest.mark.parametrize("name", list(_abstract_plans()))
@pytest.mark.parametrize("model", ["nemotron-h-tiny", "jamba-tiny", "qwen3-next-tiny"])
def test_abstract_plans_are_split_as_simulate_costs_them(name, model):
    plan = _abstract_plans()[name]
    assert all(st.abstract for st in plan.stages)
    spec = train.model_spec(plan, model)
    executed = stage_layers(plan, spec.num_layers, default_layer_costs(spec))
    table = cost_table(model=model, device="cpu")  # `octodsl simulate --model M --device cpu`
    simulated = table.stage_ranges(plan)
    assert executed == [range(a, b + 1) for a, b in simulated]
    costs = SimCosts.from_table(table, plan)
    # the simulator's stage costs are its layers' sums (same additions, same order)
    assert [c.f for c in costs.stages] == [sum(table.layers[i].f for i in r) for r in executed]


def test_the_start_up_line_says_the_tp_group():
    plan = generate("1f1b", devices=2, microbatches=4, model="nemotron-h-tiny")
    tp = plan.__class__(
        plan.header.model_copy(update={"tp": 2, "dp": 2}),
        plan.stages,
        plan.placement,
        plan.schedule,
    )
    line = train.startup_line(tp, train.model_spec(tp, None))
    assert (
        "on each of 2 data-parallel copies, each device a tp group of 2 (sequence-parallel) ("
        in line
    )
    assert "tp group" not in train.startup_line(plan, train.model_spec(plan, None))


def test_stock_deepspeed_cannot_run_tp():
    plan = generate("1f1b", devices=2, microbatches=4, model="nemotron-h-tiny")
    tp = plan.__class__(
        plan.header.model_copy(update={"tp": 2}), plan.stages, plan.placement, plan.schedule
    )
    args = train.parse_args(["--deepspeed_config", "c.json", "--schedule", "p.octo", "--stock"])
    with pytest.raises(
        train.OctoError, match="has no tensor-parallel layers; the plan's `tp 2` needs"
    ):
        train.build_engine(args, tp, train.model_spec(tp, None))


def test_the_start_up_line_says_the_ep_and_stock_deepspeed_cannot_run_it():
    plan = generate("1f1b", devices=2, microbatches=4, model="qwen3-next-tiny")
    ep = plan.__class__(
        plan.header.model_copy(update={"ep": 2, "dp": 2}),
        plan.stages,
        plan.placement,
        plan.schedule,
    )
    spec = train.model_spec(ep, None)
    assert (
        "on each of 2 data-parallel copies, each MoE layer's experts spread over ep 2 of the "
        "copies (" in train.startup_line(ep, spec)
    )
    assert "ep 2" not in train.startup_line(plan, spec)
    args = train.parse_args(["--deepspeed_config", "c.json", "--schedule", "p.octo", "--stock"])
    with pytest.raises(train.OctoError, match="are not expert-parallel; the plan's `ep 2` needs"):
        train.build_engine(args, ep, spec)
