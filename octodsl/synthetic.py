"""Synthetic training data generated in-process: token sequences that follow a fixed modular rule
from a random start, the same for every engine and every run with the same seed, so losses
compare across runs and no data set is downloaded.

Each task is an affine map x' = (multiplier * x + increment) mod symbols over the first
`symbols` token ids; every label (the next token) follows from the input token before it, so the
loss can fall to zero on every position.

- `affine` (examples/train.py's default): x' = (5x + 3) mod vocab over the whole vocabulary. A
  model must learn a lookup of `vocab` entries, each token seen about once per step at the tiny
  models' shape: learnable in principle, not within a demo's ~20 steps.
- `modadd`: counting in steps of 3 modulo 16, x' = (x + 3) mod 16. A model first learns which 16
  ids occur (loss ln 16 = 2.77, the best without the rule), then the rule (loss towards 0);
  nemotron-h-tiny learns it within ~20 steps at lr 1e-3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import OctoError

MAX_ALPHABET = 2**31
"""Token ids a task draws from: the product of two stays in int64."""


class TaskError(OctoError):
    """A task that cannot generate data for the asked shape or vocabulary."""


@dataclass(frozen=True)
class Task:
    """x' = (multiplier * x + increment) mod symbols, from a uniformly random start."""

    name: str
    multiplier: int
    increment: int
    symbols: int | None
    """Token ids used (the first `symbols`); None: the whole vocabulary."""
    description: str

    def alphabet(self, vocab: int) -> int:
        return vocab if self.symbols is None else self.symbols

    def floor(self, vocab: int) -> float:
        """The loss of a model that knows which ids occur but not the rule: ln(alphabet)."""
        return math.log(self.alphabet(vocab))


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("affine", 5, 3, None, "x' = (5x + 3) mod vocab over the whole vocabulary"),
        Task("modadd", 1, 3, 16, "x' = (x + 3) mod 16: counting in steps of 3 over 16 ids"),
    )
}
"""The tasks by name; `affine` first (the default)."""


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise TaskError(f"unknown task {name!r} (known: {', '.join(TASKS)})") from None


def check(task: Task, batch: int, seq: int, vocab: int) -> None:
    """TaskError unless `task` can fill micro-batches of `batch` x `seq` tokens for a model of
    `vocab` token ids."""
    for what, value in (
        ("micro-batch size", batch),
        ("sequence length", seq),
        ("vocabulary", vocab),
    ):
        if value < 1:
            raise TaskError(f"task {task.name}: {what} must be at least 1, not {value}")
    if vocab < 2:
        raise TaskError(
            f"task {task.name} needs at least 2 token ids; the model's vocabulary has {vocab}"
        )
    if task.alphabet(vocab) > MAX_ALPHABET:
        raise TaskError(
            f"task {task.name}: at most {MAX_ALPHABET:,} token ids (products of two "
            f"ids stay in int64); the model's vocabulary has {vocab:,}"
        )
    if task.symbols is not None and vocab < task.symbols:
        raise TaskError(
            f"task {task.name} uses token ids 0..{task.symbols - 1}; the model's "
            f"vocabulary has only {vocab}"
        )


def sequences(
    task: Task, generator: torch.Generator, batch: int, seq: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels), each [batch, seq] int64: `batch` sequences of seq + 1 tokens following the
    rule from starts drawn with `generator`; the labels are the ids shifted by one."""
    check(task, batch, seq, vocab)
    n = task.alphabet(vocab)
    start = torch.randint(0, n, (batch,), generator=generator)
    # x_t = a_t x_0 + c_t (mod n) with a_{t+1} = m a_t, c_{t+1} = m c_t + increment: exact integer
    # arithmetic (all below n^2), the same tokens as applying the rule t times
    a, c = [1], [0]
    for _ in range(seq):
        a.append(a[-1] * task.multiplier % n)
        c.append((c[-1] * task.multiplier + task.increment) % n)
    tokens = (start[:, None] * torch.tensor(a) + torch.tensor(c)) % n
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
