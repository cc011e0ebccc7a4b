"""The largest values octodsl accepts, one place for every input (plan text, CSV, options).

Each bounds the work or memory a single number can cause, so that a typo such as `devices 1e8`
or `for i in 0..1000000000000 {}` is refused at once with a message naming the limit, instead of
hanging or exhausting memory. They are far above what any real plan needs (the paper's largest
runs: 8192 GPUs, pipelines of 32-64 devices, a few hundred micro-batches). docs/language.md
lists them under "Limits"; tests/test_limits.py checks that list against these values.
"""

from __future__ import annotations

MAX_INT = 10**12
"""Any whole number written in a plan or a CSV."""
MAX_DEVICES = 4096
"""Pipeline devices of one plan (`devices`, `-p`)."""
MAX_STAGES = 65536
"""Stages of one plan."""
MAX_MICROBATCHES = 65536
"""Micro-batches per iteration (`microbatches`, `-m`)."""
MAX_OPS = 1_000_000
"""Ops of one plan after loops and ranges are unrolled (lint takes about 12 s at this size)."""
MAX_LOOP_ITERATIONS = 1_000_000
"""Iterations of all `for` loops of a plan together, empty bodies included."""
MAX_NESTING = 64
"""Nesting depth of `for` loops, and of parentheses and operators in one expression."""
MAX_DP = 1 << 20
"""Data-parallel copies (`dp`)."""
MAX_GPUS = 1 << 20
"""GPUs of one cluster (`tune --gpus`)."""
MAX_GLOBAL_BATCH = 1 << 24
"""Sequences per iteration over all data-parallel copies (`tune --global-batch`)."""
MAX_TP = 1024
"""Tensor-parallel degree (`tp`)."""
MAX_GPUS_PER_NODE = 1024
"""GPUs per node (`gpus_per_node`)."""
MAX_MICROBATCH_SIZE = 1 << 16
"""Sequences per micro-batch."""
MAX_SEQ_LEN = 1 << 24
"""Tokens per sequence."""
MAX_MEMORY = 1 << 50
"""Memory per device, bytes (1 PiB)."""
MAX_LAYERS = 65536
"""Layers of one model spec."""
MAX_WIDTH = 1 << 24
"""Any width of a model spec: `hidden`, `vocab` and each layer's dimensions (heads, ffn, ...)."""
MAX_FILE_BYTES = 1 << 28
"""Bytes of any file octodsl reads (a plan, a CSV, a model spec, a profile, a trace); device
and link files (1 MiB) and Hugging Face configs (16 MiB) have smaller limits of their own."""
MAX_STEPS = 1000
"""Training steps or timed runs a command makes itself (`calibrate --steps`, `profile
--repeats` and `--warmup`)."""
MAX_THREADS = 1024
"""CPU threads of one process (`profile --threads`)."""
MAX_SECONDS = 10**6
"""Any time in seconds given on the command line (`--costs`, `tune --budget`): 11.6 days."""
MAX_EVALUATIONS = 10**9
"""Plans a search may simulate (`tune --evaluations`)."""
MAX_SEARCHES = 1000
"""Searches one tune may run, one after another while its budget lasts (`tune --searches`)."""
MAX_JOBS = 256
"""Searches one tune may run at once, each in a process of its own (`tune --jobs`)."""
MAX_TIMEOUT = 86400
"""Seconds the executor's watchdog lets a rank wait for one message (`"octo": {"timeout"}`)."""
MAX_TRAIN_STEPS = 10**7
"""Training steps of one `examples/train.py` run (`--steps`)."""
MAX_SEED = 2**32 - 1
"""Random seeds (`examples/train.py --seed`; its data seeds derive from it and stay in torch's
64-bit range)."""

LIMITS_DOC = "docs/language.md#limits"
"""Where the limits are listed for users; every refusal's message points there."""


def at_most(limit: int, what: str) -> str:
    """How a refusal names its limit: `at_most(MAX_DEVICES, "devices")` is
    'at most 4096 devices (docs/language.md#limits)'; `what` may be empty."""
    shown = f"{limit:,}" if limit >= 10_000 else str(limit)
    return f"at most {shown}{' ' + what if what else ''} ({LIMITS_DOC})"
