"""The vocab-parallel embedding, LM head and cross-entropy against the unsplit layers, on a tp
group of 2 gloo processes in float64: the forward (the embedding's output, the loss), the input
gradient and every parameter gradient (this rank's rows of the unsplit layer's, zero on the
padding rows; the norm's whole gradient, summed over the group under sp as the engine sums it),
with the vocabulary divisible by tp and padded, sp on and off, a fused backward and a split one
(B then W), and tied embeddings.

The two processes are spawned once for the module and run every case; each case's largest
difference over both ranks is judged by its own test.
"""

from __future__ import annotations

import os
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from octodsl.layers import LMHead, TiedEmbeddingHead, lm_loss
from octodsl.layers import tensor_parallel as tpl
from octodsl.layers.embedding import Embedding
from octodsl.layers.split_backward import backward_input, backward_weight
from octodsl.models.tp import padded_vocab

TP = 2
HIDDEN, BATCH, SEQ = 8, 2, 6
TOL = 1e-12
SEED = 5
VOCABS = {"even": 14, "padded": 13}
CASES = [
    f"{layer}-{vocab}-{sp}{'-split' if split else ''}"
    for layer in ("embedding", "head", "tied")
    for vocab in VOCABS
    for sp in ("nosp", "sp")
    for split in ((False, True) if layer == "head" else (False,))
]


def _rows(t: torch.Tensor, vocab: int, rank: int) -> torch.Tensor:
    """Rank's rows of a [vocab, ...] tensor, padded with zero rows as the layers pad."""
    rows = padded_vocab(vocab, TP) // TP
    out = torch.zeros(rows, *t.shape[1:])
    real = t[rank * rows : min((rank + 1) * rows, vocab)]
    out[: len(real)] = real
    return out


def _sum_sequence_parallel(module: torch.nn.Module, tp: tpl.TpGroup) -> None:
    for p in module.parameters():
        if getattr(p, "sequence_parallel", False):
            dist.all_reduce(p.grad, group=tp.group)


def run_case(name: str, tp: tpl.TpGroup) -> float:
    """The largest difference between the tp layer and the unsplit one, on this rank."""
    layer, vocab_name, _, *split = name.split("-")
    vocab = VOCABS[vocab_name]
    make = {
        "embedding": lambda: Embedding(vocab, HIDDEN),
        "head": lambda: LMHead(vocab, HIDDEN),
        "tied": lambda: TiedEmbeddingHead(vocab, HIDDEN),
    }[layer]
    torch.manual_seed(SEED)
    ref = make()
    torch.manual_seed(SEED)
    with tpl.building(tp):
        mine = make()
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=g)
    labels = torch.randint(0, vocab, (BATCH, SEQ), generator=g)
    labels[0, 0] = vocab - 1  # the last real column (next to the padding) is a target
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=g)
    gy = torch.randn(BATCH, SEQ, HIDDEN, generator=g)
    diffs = []
    if layer == "embedding":
        yr, ym = ref(ids), mine(ids)
        yr.backward(gy)
        ym.backward(tpl.seq_slice(gy, tp))
        diffs.append((ym - tpl.seq_slice(yr, tp)).abs().max())
    elif layer == "head":
        xr, xm = x.clone().requires_grad_(), tpl.seq_slice(x, tp).clone().requires_grad_()
        lr, lm = lm_loss(ref(xr), labels), lm_loss(mine(xm), labels)
        lr.backward()
        if split:
            (gx,), state = backward_input([lm], [torch.ones_like(lm)], [xm])
            assert all(p.grad is None for p in mine.parameters()), "B touched a weight"
            backward_weight(state, list(mine.parameters()))
            xm.grad = gx
        else:
            lm.backward()
        diffs += [(lm - lr).abs(), (xm.grad - tpl.seq_slice(xr.grad, tp)).abs().max()]
    else:  # the tied module embeds, then (a stand-in for the layers between) gives the loss
        lr, lm = (lm_loss(m.head(m(ids) * 1.5), labels) for m in (ref, mine))
        lr.backward()
        lm.backward()
        diffs.append((lm - lr).abs())
    _sum_sequence_parallel(mine, tp)
    refs = dict(ref.named_parameters())
    for pname, p in mine.named_parameters():
        r = refs[pname]
        if getattr(p, "tensor_model_parallel", False):
            assert pname == "weight" and p.shape == (padded_vocab(vocab, TP) // TP, HIDDEN)
            want, want_grad = _rows(r.detach(), vocab, tp.rank), _rows(r.grad, vocab, tp.rank)
        else:
            assert p.shape == r.shape, pname
            want, want_grad = r.detach(), r.grad
        diffs += [(p.detach() - want).abs().max(), (p.grad - want_grad).abs().max()]
    return max(float(d) for d in diffs)


def _worker(rank: int, port: int, queue) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=TP)
        torch.set_default_dtype(torch.float64)
        torch.set_num_threads(1)
        group = dist.new_group(list(range(TP)))
        out = {}
        for name in CASES:
            tp = tpl.TpGroup(TP, rank, group, sp="-sp" in name)
            out[name] = run_case(name, tp)
        queue.put((rank, out))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        queue.put((rank, traceback.format_exc()))


@pytest.fixture(scope="module")
def diffs() -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(TP)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    merged: dict[str, float] = {}
    for _, out in results:
        assert isinstance(out, dict), out
        for k, v in out.items():
            merged[k] = max(merged.get(k, 0.0), v)
    return merged


@pytest.mark.parametrize("case", CASES)
def test_vocab_parallel_equals_the_unsplit_layer(diffs, case):
    assert diffs[case] <= TOL, (case, diffs[case])


def test_tp_1_builds_the_same_layers_as_before():
    # at tp 1 nothing is a shard and the loss is F.cross_entropy itself (bit for bit)
    torch.manual_seed(SEED)
    head = LMHead(VOCABS["padded"], HIDDEN)
    assert not hasattr(head.weight, "tensor_model_parallel")
    assert head.weight.shape == (VOCABS["padded"], HIDDEN)
    x, labels = torch.randn(BATCH, SEQ, HIDDEN), torch.randint(0, VOCABS["padded"], (BATCH, SEQ))
    logits = head(x)
    assert torch.equal(
        lm_loss(logits, labels),
        torch.nn.functional.cross_entropy(logits.reshape(-1, VOCABS["padded"]), labels.reshape(-1)),
    )
