"""The search space of `tune --gpus` (octodsl.tune.space): checked against brute force over
every (tp, pp, dp, micro-batch size, micro-batches, ZeRO, ep) of the definition in space.py's
docstring, on small clusters of the tiny models, with memory limits from a few percent of the
model's bytes to none, so that both feasible and infeasible configurations occur."""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import cache

from hypothesis import example, given, settings
from hypothesis import strategies as st

from octodsl.models import load_model
from octodsl.models.tp import tp_problems
from octodsl.tune.cluster.search import NoConfigurationFits, _enumerate
from octodsl.tune.cluster.space import (
    INFEASIBLE,
    Cluster,
    Config,
    Tables,
    configurations,
    fewest_gpus,
    infeasible,
    problem_of,
    tp_degrees,
)
from octodsl.tune.cluster.target import admits

MODELS = ("nemotron-h-tiny", "jamba-tiny", "qwen3-next-tiny")
MONOTONE = "a smaller micro-batch"
"""How _enumerate words a skip it makes without a problem of its own."""


@cache
def model_bytes(model: str) -> float:
    """One micro-batch of one sequence through the whole model on one GPU: static bytes and
    activations (what a memory limit is measured against here)."""
    table = Tables(Cluster(model, 1, 1))(1, 1)
    return float(sum(l.static + l.act for l in table.layers))


@st.composite
def clusters(
    draw,
    max_gpus: int = 64,
    max_batch: int = 96,
    fixed: bool = True,
    memory: tuple[float, float] = (-6.0, 0.5),
) -> Cluster:
    """A small cluster of a tiny model: memory per GPU 2**e of the model's bytes for e in
    `memory`, or none; with `fixed`, now and then some choices fixed."""
    model = draw(st.sampled_from(MODELS))
    exponent = draw(st.none() | st.floats(*memory))
    fix = fixed and draw(st.integers(0, 3)) == 0
    pick = (lambda s: draw(st.none() | s)) if fix else (lambda s: None)
    return Cluster(
        model,
        draw(st.integers(1, max_gpus)),
        draw(st.integers(1, max_batch)),
        gpus_per_node=draw(st.sampled_from((1, 2, 4, 8))),
        memory=None if exponent is None else int(2**exponent * model_bytes(model)),
        tp=pick(st.sampled_from((1, 2, 4, 8))),
        pp=pick(st.integers(1, 8)),
        microbatch_size=pick(st.integers(1, 4)),
        zero=pick(st.integers(0, 2)),
        ep=pick(st.sampled_from((1, 2, 3, 4, 16))),
    )


def splits(model: str, tp: int) -> bool:
    return not any(p.fatal for p in tp_problems(load_model(model), tp))


def expert_counts(model: str) -> set[int]:
    return {getattr(layer, "experts", 0) for layer in load_model(model).layers} - {0}


def brute_force(c: Cluster) -> list[Config]:
    """Every configuration of the definition, by trying every number in range."""
    layers = len(load_model(c.model).layers)
    experts = expert_counts(c.model)
    out = []
    for tp in range(1, c.gpus_per_node + 1):
        if c.gpus_per_node % tp or not splits(c.model, tp):
            continue
        for pp in range(1, layers + 1):
            for dp in range(1, c.gpus + 1):
                if tp * pp * dp != c.gpus:
                    continue
                for mbs in range(1, c.global_batch + 1):
                    for m in range(1, c.global_batch + 1):
                        if dp * mbs * m != c.global_batch:
                            continue
                        for zero, ep in itertools.product((0, 1, 2), range(1, dp + 1)):
                            config = Config(tp, pp, dp, mbs, m, zero, ep)
                            if (
                                (zero == 0 or dp > 1)
                                and (ep == 1 or (experts and dp % ep == 0))
                                and all(n % ep == 0 for n in experts)
                                and admits(c.target, zero)
                                and all(
                                    getattr(c, k) in (None, getattr(config, k))
                                    for k in ("tp", "pp", "microbatch_size", "zero", "ep")
                                )
                            ):
                                out.append(config)
    return out


@given(clusters())
def test_configurations_are_the_definitions(c):
    got = list(configurations(c, tp_degrees(c)[0]))
    assert len(got) == len(set(got)), "no configuration twice"
    assert sorted(got) == sorted(brute_force(c))
    assert all(
        x.gpus == c.gpus and x.dp * x.microbatch_size * x.microbatches == c.global_batch
        for x in got
    )


@given(clusters())
def test_tp_degrees_exclude_exactly_what_the_model_or_node_cannot_split(c):
    tps, why = tp_degrees(c)
    in_node = [
        tp for tp in range(1, c.gpus_per_node + 1) if c.gpus_per_node % tp == 0 and c.gpus % tp == 0
    ]
    assert tps == [tp for tp in in_node if splits(c.model, tp) and c.tp in (None, tp)]
    assert sorted(why) == [tp for tp in in_node if not splits(c.model, tp)]
    for tp, message in why.items():
        assert message == next(p.message for p in tp_problems(load_model(c.model), tp) if p.fatal)


def feasible(c: Cluster, config: Config, tables: Tables) -> bool:
    return infeasible(problem_of(c, config, tables)) is None


@settings(max_examples=40)  # an example checks every GPU count up to the answer (~0.1 s)
@given(clusters(max_gpus=8, max_batch=24, fixed=False, memory=(-4.5, -1.0)))
@example(Cluster("jamba-tiny", 1, 8, memory=int(model_bytes("jamba-tiny") / 16)))  # tp 4 on 16
def test_fewest_gpus_is_the_fewest_that_fit(c):
    """Checked against every configuration of every GPU count in between, each with its own
    tps (tp 4 is out on 6 GPUs, in on 8)."""
    tables = Tables(c)
    found = fewest_gpus(c, tables, above=c.gpus)
    if found is not None:
        assert found.gpus > c.gpus and feasible(replace(c, gpus=found.gpus), found, tables)
        assert found in configurations(
            replace(c, gpus=found.gpus), tp_degrees(replace(c, gpus=found.gpus))[0]
        )
    end = found.gpus if found is not None else c.gpus + 16
    for gpus in range(c.gpus + 1, end):
        other = replace(c, gpus=gpus)
        fits = [
            x for x in configurations(other, tp_degrees(other)[0]) if feasible(other, x, tables)
        ]
        assert not fits, f"{fits[0]} on {gpus} GPUs fits, fewer than {found}"


@settings(max_examples=60)  # an example proves every skip in up to 32 GPUs' space (~0.1 s)
@given(clusters(max_gpus=32, max_batch=48))
@example(Cluster("nemotron-h-tiny", 8, 16, memory=int(model_bytes("nemotron-h-tiny") / 6)))
def test_enumerate_splits_the_space_soundly(c):
    """Every configuration is a candidate (some plan may fit) or skipped as infeasible, and
    every skip is: those skipped for a smaller micro-batch that does not fit (memory only grows
    with the micro-batch) have their own proof."""
    tps, excluded = tp_degrees(c)
    tables = Tables(c)
    space = list(configurations(c, tps))
    try:
        candidates, skipped = _enumerate(c, tps, tables, excluded)
    except NoConfigurationFits:
        assert not any(feasible(c, x, tables) for x in space)
        return
    assert sorted([x.config for x in candidates] + [s.config for s in skipped]) == sorted(space)
    for s in skipped:
        assert s.why == INFEASIBLE
        why = infeasible(problem_of(c, s.config, tables))
        assert why is not None, f"{s.config} is skipped as infeasible but may fit"
        if not s.detail.startswith(MONOTONE):
            assert s.detail == why
    for x in candidates:
        assert x.bound == x.problem.tight_lower_bound() and feasible(c, x.config, tables)
    assert [(x.bound, x.config) for x in candidates] == sorted(
        (x.bound, x.config) for x in candidates
    )


def test_a_micro_batch_over_the_op_limit_does_not_rule_out_larger_ones():
    """Over the op limit is no proof about memory: the next micro-batch size, with half the
    micro-batches, is a candidate of its own."""
    c = Cluster("nemotron-h-tiny", 24, 1 << 14, tp=1, pp=24, microbatch_size=None)
    tps, excluded = tp_degrees(c)
    candidates, skipped = _enumerate(c, tps, Tables(c), excluded)
    assert [(s.config.microbatch_size, "ops" in s.detail) for s in skipped] == [(1, True)]
    assert min(x.config.microbatch_size for x in candidates) == 2
