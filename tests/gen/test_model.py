"""`gen --model`: the plan names the model and cuts its layers into the schedule's stages."""

from __future__ import annotations

import pytest

from octodsl.costs.resolve import cost_table
from octodsl.gen import ScheduleError, generate, generate_text
from octodsl.lint import lint_source
from octodsl.models import load_model
from octodsl.partition import balance_parameters, balance_time, equal_layers

MODEL = "nemotron-h-8b"


@pytest.mark.parametrize(
    "name, stages", [("1f1b", 4), ("interleaved", 8), ("zb-v", 8), ("dualpipev", 8)]
)
def test_time_balanced_stages_of_the_model(name, stages):
    plan = generate(name, 4, 8, model=MODEL)
    assert plan.header.model == MODEL
    work = [c.f + c.b + c.w for c in cost_table(model=MODEL).layers]
    assert [(s.first, s.last) for s in plan.stages] == balance_time(work, stages)
    spec = load_model(MODEL)
    assert "".join(s.symbols for s in plan.stages) == spec.pattern
    _, diags = lint_source(generate_text(name, 4, 8, model=MODEL), "<gen>")
    assert diags == []


def test_other_partitions_and_shape():
    layers = cost_table(model=MODEL, microbatch_size=2, seq_len=2048).layers
    plan = generate(
        "1f1b", 4, 8, model=MODEL, partition="parameters", microbatch_size=2, seq_len=2048
    )
    params = [c.params for c in layers]
    assert [(s.first, s.last) for s in plan.stages] == balance_parameters(params, 4)
    assert (plan.header.microbatch_size, plan.header.seq_len) == (2, 2048)
    plan = generate("gpipe", 4, 8, model=MODEL, partition="equal")
    assert [(s.first, s.last) for s in plan.stages] == equal_layers(len(layers), 4)


def test_model_errors_are_schedule_errors():
    with pytest.raises(ScheduleError, match="no built-in model"):
        generate("1f1b", 4, 8, model="no-such-model")
    n = load_model("nemotron-h-tiny").num_layers
    with pytest.raises(ScheduleError, match="too few"):
        generate("zb-v", n, 2 * n, model="nemotron-h-tiny")
    with pytest.raises(ScheduleError, match="unknown device"):
        generate("1f1b", 2, 2, model=MODEL, device="X1")
