"""octodsl.synthetic: the tasks follow their rule, are deterministic by seed, refuse shapes and
vocabularies they cannot fill, and `modadd` is learnt by a small hybrid in a few steps."""

from __future__ import annotations

import math

import pytest
import torch

from octodsl.errors import OctoError
from octodsl.layers import build_layers, lm_loss
from octodsl.models import load_model
from octodsl.models.load import parse_model
from octodsl.synthetic import MAX_ALPHABET, TASKS, TaskError, get_task, sequences


def _draw(task: str, seed: int = 0, batch: int = 3, seq: int = 50, vocab: int = 8192):
    return sequences(get_task(task), torch.Generator().manual_seed(seed), batch, seq, vocab)


@pytest.mark.parametrize("name", TASKS)
def test_labels_follow_the_rule_applied_step_by_step(name):
    task = TASKS[name]
    vocab = 8192
    ids, labels = _draw(name, seq=300, vocab=vocab)
    n = task.alphabet(vocab)
    assert ids.shape == labels.shape == (3, 300) and ids.dtype == torch.int64
    # the closed form the generator uses against the rule itself
    assert torch.equal(labels, (task.multiplier * ids + task.increment) % n)
    assert torch.equal(ids[:, 1:], labels[:, :-1])
    assert int(ids.min()) >= 0 and int(labels.max()) < n


def test_modadd_uses_16_ids_and_affine_the_whole_vocabulary():
    assert set(_draw("modadd", batch=8, seq=64)[0].unique().tolist()) == set(range(16))
    assert int(_draw("affine", batch=64, seq=64)[0].max()) >= 16


@pytest.mark.parametrize("name", TASKS)
def test_deterministic_by_seed(name):
    a, b, c = _draw(name, 7), _draw(name, 7), _draw(name, 8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_sequence_length_one_is_one_predictable_pair():
    ids, labels = _draw("modadd", seq=1)
    assert ids.shape == (3, 1)
    assert torch.equal(labels, (ids + 3) % 16)


@pytest.mark.parametrize(
    "batch, seq, vocab, words",
    [
        (1, 0, 8192, "sequence length must be at least 1"),
        (0, 8, 8192, "micro-batch size must be at least 1"),
        (1, 8, 0, "vocabulary must be at least 1"),
        (1, 8, 1, "at least 2 token ids"),
        (1, 8, 15, "uses token ids 0..15; the model's vocabulary has only 15"),
    ],
)
def test_refuses_what_it_cannot_fill(batch, seq, vocab, words):
    with pytest.raises(TaskError, match=words):
        sequences(get_task("modadd"), torch.Generator(), batch, seq, vocab)


def test_refuses_a_vocabulary_whose_products_overflow():
    with pytest.raises(TaskError, match="at most"):
        sequences(get_task("affine"), torch.Generator(), 1, 4, MAX_ALPHABET + 1)


def test_unknown_task_names_the_known_ones():
    with pytest.raises(OctoError, match="known: affine, modadd"):
        get_task("copy")


def test_floor_is_the_entropy_of_the_alphabet():
    assert TASKS["modadd"].floor(8192) == pytest.approx(math.log(16))
    assert TASKS["affine"].floor(8192) == pytest.approx(math.log(8192))


def test_a_small_hybrid_learns_modadd_in_a_few_steps():
    """One process, a Mamba2 + attention + MLP slice of nemotron-h-tiny (~2 s): the loss falls
    from about ln(vocab) to well below ln 16, so the model learnt the rule, not only which ids
    occur."""
    spec = load_model("nemotron-h-tiny").compact()
    spec.update(name="small", pattern="M*-", seq_len=32, microbatch_size=4)
    spec = parse_model(spec, "test")
    torch.manual_seed(0)
    layers = build_layers(spec, seed=0)
    opt = torch.optim.AdamW([p for layer in layers for p in layer.parameters()], lr=1e-2)
    g = torch.Generator().manual_seed(0)
    run = []
    for _ in range(8):
        x, labels = sequences(get_task("modadd"), g, 4, 32, spec.vocab)
        for layer in layers:
            x = layer(x)
        loss = lm_loss(x, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.append(loss.item())
    assert run[0] > 0.9 * math.log(spec.vocab)
    assert run[-1] < 0.25 * math.log(16), run
