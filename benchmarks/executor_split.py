"""Cost of the split backward (B then W) against one fused backward, as the executor runs it:
each layer on a detached input, B layer by layer down the stage, one merged W.

    OMP_NUM_THREADS=1 python benchmarks/executor_split.py [--model nemotron-h-tiny] \\
        [--seq-len 128] [--repeats 7]

Times are CPU seconds of this process (robust to other load on the machine). Prints, per
stage-sized chunk of the model and for a chunk of 128 tiny blocks (the worst case
for per-node Python work), the median fused, B, W and (B + W) / fused times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from octodsl.layers import build_layers, lm_loss
from octodsl.layers.split_backward import (
    WeightGradState,
    backward_input,
    backward_weight,
)
from octodsl.models import load_model


def segmented_forward(layers, x):
    segments = []
    for layer in layers:
        x_in = x.detach().requires_grad_(x.is_floating_point()) if segments else x
        x = layer(x_in)
        segments.append((x_in, x))
    return segments


def time_chunk(layers, make_input, finish, params, repeats: int) -> dict[str, float]:
    """Median seconds of a fused backward and of B and W over the chunk."""
    fused, bs, ws = [], [], []
    for _ in range(repeats + 2):
        x = make_input()
        out = x
        for layer in layers:
            out = layer(out)
        root = finish(out)
        start = time.process_time()
        root.backward()
        fused.append(time.process_time() - start)
        for p in params:
            p.grad = None

        segments = segmented_forward(layers, make_input())
        segments[-1] = (segments[-1][0], finish(segments[-1][1]))
        start = time.process_time()
        states, outs, grads = [], [segments[-1][1]], [torch.ones_like(segments[-1][1])]
        for k in reversed(range(len(segments))):
            ins, layer_out = segments[k]
            if k < len(segments) - 1:
                outs, grads = [layer_out], grads
            grads, state = backward_input(outs, grads, [ins])
            states.append(state)
        mid = time.process_time()
        backward_weight(WeightGradState.merge(states), params)
        ws.append(time.process_time() - mid)
        bs.append(mid - start)
        for p in params:
            p.grad = None
    med = {k: statistics.median(v[2:]) for k, v in (("fused", fused), ("b", bs), ("w", ws))}
    med["ratio"] = (med["b"] + med["w"]) / med["fused"]
    return med


class TinyBlock(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.up = nn.Linear(h, 4 * h)
        self.down = nn.Linear(4 * h, h)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="nemotron-h-tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = load_model(args.model).with_shape(1, args.seq_len)
    layers = build_layers(spec, seed=0)
    n = len(layers)
    ids = torch.randint(0, spec.vocab, (1, args.seq_len))
    labels = torch.randint(0, spec.vocab, (1, args.seq_len))
    hidden = torch.randn(1, args.seq_len, spec.hidden)
    chunks = {
        f"layers 0..{n // 2 - 1} (first stage)": (
            layers[: n // 2],
            lambda: ids,
            lambda y: y.float().square().mean(),
        ),
        f"layers {n // 2}..{n - 1} (last stage)": (
            layers[n // 2 :],
            lambda: hidden.clone().requires_grad_(),
            lambda y: lm_loss(y, labels),
        ),
    }
    blocks = [TinyBlock(32) for _ in range(128)]
    chunks["128 tiny blocks (h=32, 16 tokens)"] = (
        blocks,
        lambda: torch.randn(16, 32).requires_grad_(),
        lambda y: y.square().mean(),
    )
    print(f"{args.model}, seq {args.seq_len}, 1 thread; medians of {args.repeats} runs")
    print("| chunk | fused (ms) | B (ms) | W (ms) | (B + W) / fused |\n|---|---|---|---|---|")
    for name, (chunk, make_input, finish) in chunks.items():
        params = [q for layer in chunk for q in layer.parameters()]
        r = time_chunk(chunk, make_input, finish, params, args.repeats)
        print(
            f"| {name} | {r['fused'] * 1e3:.1f} | {r['b'] * 1e3:.1f} | {r['w'] * 1e3:.1f} | {r['ratio']:.3f} |"
        )


if __name__ == "__main__":
    main()
