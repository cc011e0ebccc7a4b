"""The per-op overheads of Megatron-style layers on A100 (`MEGATRON_A100_OVERHEADS`,
octodsl/costs/devices.py), fitted to ZeroBubble's per-op profile: writes
benchmarks/fit_overheads.md.

    .venv/bin/python benchmarks/fit_overheads.py [-o benchmarks/fit_overheads.md]

The profile (`PROFILE`) is ZeroBubble's Table 6 (Qi et al., Zero Bubble Pipeline Parallelism,
ICLR 2024, arXiv 2401.10241): T_F, T_B, T_W and T_comm in milliseconds of one stage of each of
its four GPT models on A100 SXM 80GB under its Megatron-LM fork, the runs of its Table 4. The
figures are copied from the LaTeX of that table kept in the paper's own code, the docstring at
the end of megatron/core/pipeline_parallel/efficiency.py on branch 'arxiv' (commit f68d3879,
2023-11-29) of github.com/sail-sg/zero-bubble-pipeline-parallelism.

How the runs were set up is that commit's examples/pretrain_zero_bubble.sh: fp16, sequence 1024,
no --use-flash-attn (Megatron's fused softmax: the scores reach memory), dropout at Megatron's
0.1; the models, micro-batch sizes and stage sizes are benchmarks/published_runs.yaml's
(Table 3: the first and last stages hold one layer fewer, so a middle stage holds
(layers + 2) / p layers).

The overheads are what the analytical model's kernels leave out, per sub-layer (attention or
MLP): F_measured = F_kernels + n x f_seconds + E x f_bytes / bandwidth, E the activation
elements (tokens x hidden) of the stage's sub-layers, likewise B; solved by least squares over
the four models (each model once: its three rows differ only in the number of micro-batches,
and their op times agree to 1-2%, so they are averaged). The message overhead is T_comm less
the model's NVLink time of the message, averaged. T_W is not fitted: it checks W out of sample.
A leave-one-model-out fit shows how well four points pin two numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from machine import check_outputs, commit, write_outputs  # noqa: E402
from published import load, rows, spec_of  # noqa: E402

PROFILE = {
    # model: [(m, T_F, T_B, T_W, T_comm), ...] in ms, Table 6 of arXiv 2401.10241.
    "zb-gpt-1.5b": [
        (24, 18.522, 18.086, 9.337, 0.601),
        (32, 18.513, 18.086, 9.331, 0.626),
        (64, 18.546, 18.097, 9.321, 0.762),
    ],
    "zb-gpt-6.2b": [
        (24, 29.718, 29.444, 19.927, 0.527),
        (32, 29.802, 29.428, 19.530, 0.577),
        (64, 29.935, 29.621, 19.388, 0.535),
    ],
    "zb-gpt-14.6b": [
        (48, 11.347, 11.248, 8.132, 0.377),
        (64, 11.307, 11.254, 8.101, 0.379),
        (128, 11.325, 11.308, 8.109, 0.378),
    ],
    "zb-gpt-28.3b": [
        (96, 10.419, 10.207, 7.715, 0.408),
        (128, 10.408, 10.204, 7.703, 0.408),
        (256, 10.402, 10.248, 7.698, 0.460),
    ],
}


@dataclasses.dataclass
class Point:
    """One model's middle stage: what was measured, and the model's terms."""

    name: str
    measured: np.ndarray
    """T_F, T_B, T_W, T_comm in seconds (mean over the table's rows)."""
    kernels: np.ndarray
    """The model's F, B, W without overheads, and the message's link time."""
    ops: int
    """Sub-layers with activations (each pays the fixed part)."""
    elements_f: float
    """Seconds of one byte per activation element at the memory bandwidth (the bytes' unit)."""


def table4_rows() -> dict[str, dict]:
    """Per model, its first Table 4 row with the source's defaults filled in (`published.rows`):
    the model, its micro-batch size and pp, as benchmarks/published.py simulates them."""
    out: dict[str, dict] = {}
    for row in rows(load()):
        if row["source"] == "zerobubble2024":
            out.setdefault(row["model"]["name"], row)
    return out


def point(row: dict, flash: bool) -> Point:
    from octodsl.costs.analytical import analytical_costs
    from octodsl.costs.devices import Overheads, get_device, get_link
    from octodsl.models.parse import parse_model

    model = row["model"]
    spec = parse_model(spec_of({**model, "flash": flash}), model["name"]).with_shape(
        microbatch_size=row["microbatch_size"]
    )
    a100 = get_device("A100")
    per_stage = 2 * (model["layers"] + 2) // row["pp"]  # sub-layers of a middle stage

    def middle(overheads: Overheads) -> list:
        table = analytical_costs(spec, dataclasses.replace(a100, overheads=overheads))
        return [l for l in table.layers if l.kind in ("attention", "mlp")][:per_stage]

    bare = middle(Overheads())
    # The element part is linear in f_bytes: its coefficient is the F of one byte per element.
    elements = sum(u.f - l.f for u, l in zip(middle(Overheads(f_bytes=1.0)), bare, strict=True))
    message = get_link(a100.node_link).time(bare[-1].out_bytes)
    measured = np.array(PROFILE[model["name"]])[:, 1:].mean(axis=0) / 1e3
    kernels = np.array(
        [sum(l.f for l in bare), sum(l.b for l in bare), sum(l.w for l in bare), message]
    )
    return Point(model["name"], measured, kernels, len(bare), elements)


def points(flash: bool) -> list[Point]:
    """The four models' points, in PROFILE's order."""
    table4 = table4_rows()
    return [point(table4[name], flash) for name in PROFILE]


def fit(points: list[Point]) -> tuple[float, float, float, float, float]:
    """(f_seconds, b_seconds, f_bytes, b_bytes, message_seconds) by least squares."""
    a = np.array([[pt.ops, pt.elements_f] for pt in points])
    out = []
    for k in (0, 1):
        y = np.array([pt.measured[k] - pt.kernels[k] for pt in points])
        out.append(np.linalg.lstsq(a, y, rcond=None)[0])
    message = float(np.mean([pt.measured[3] - pt.kernels[3] for pt in points]))
    return float(out[0][0]), float(out[1][0]), float(out[0][1]), float(out[1][1]), message


def predict(pt: Point, c: tuple[float, float, float, float, float]) -> np.ndarray:
    fs, bs, fb, bb, msg = c
    return np.array(
        [
            pt.kernels[0] + pt.ops * fs + pt.elements_f * fb,
            pt.kernels[1] + pt.ops * bs + pt.elements_f * bb,
            pt.kernels[2],
            pt.kernels[3] + msg,
        ]
    )


def report(flash: bool) -> list[str]:
    pts = points(flash)
    c = fit(pts)
    lines = [
        f"Fitted (flash attention {'on' if flash else 'off'}): f_seconds {c[0] * 1e3:.3f} ms, "
        f"b_seconds {c[1] * 1e3:.3f} ms, f_bytes {c[2]:.1f}, b_bytes {c[3]:.1f}, "
        f"message_seconds {c[4] * 1e3:.3f} ms.",
        "",
        "| model | sub-layers | F ms: measured / kernels / fitted | B ms | W ms (not fitted) "
        "| comm ms | F, B leave-one-out error |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, pt in enumerate(pts):
        fitted = predict(pt, c)
        loo = predict(pt, fit(pts[:i] + pts[i + 1 :]))
        m, k = pt.measured * 1e3, pt.kernels * 1e3
        err = [f"{(loo[j] / pt.measured[j] - 1) * 100:+.1f}%" for j in (0, 1)]
        lines.append(
            f"| {pt.name} | {pt.ops} | {m[0]:.2f} / {k[0]:.2f} / {fitted[0] * 1e3:.2f} | "
            f"{m[1]:.2f} / {k[1]:.2f} / {fitted[1] * 1e3:.2f} | {m[2]:.2f} / {k[2]:.2f} "
            f"({(pt.kernels[2] / pt.measured[2] - 1) * 100:+.1f}%) | {m[3]:.3f} / "
            f"{fitted[3] * 1e3:.3f} | {', '.join(err)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, default=REPO / "benchmarks" / "fit_overheads.md")
    args = ap.parse_args(argv)
    if not check_outputs("fit_overheads.py", [args.output]):
        return 2
    text = [
        "# Per-op overheads fitted to ZeroBubble's per-op profile",
        "",
        f"Made by `.venv/bin/python benchmarks/fit_overheads.py` at commit {commit()} "
        "(the method and the source: the script's docstring). What `MEGATRON_A100_OVERHEADS` "
        "holds is the flash-off fit, how the profiled runs ran.",
        "",
    ]
    for flash in (False, True):
        text += report(flash) + [""]
    if not write_outputs("fit_overheads.py", {args.output: "\n".join(text)}):
        return 2
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
