"""A simulated iteration as a Gantt chart (PNG, matplotlib).

One row per device: its compute ops as bars coloured by kind (a device's second chunk in a
lighter shade) with the micro-batch number on each bar, and under it a thin band of its
communication (messages and data-parallel collectives). The figure widens with the ops per device, so that labels stay readable
(8 devices x 32 micro-batches of a split-backward schedule is about 3000 pixels wide).
"""

from __future__ import annotations

from collections import defaultdict

from ..fileio import open_atomic
from .result import SimResult

COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868", "BW": "#8172B3"}
COMM_COLOUR = "#7F7F7F"
_OP_INCHES = 0.3
"""Width given to each op of the busiest device."""
_MAX_LABELS = 5000
"""Past this many ops, bars only: text is most of matplotlib's drawing time."""


def write_gantt(result: SimResult, path: str, title: str | None = None) -> None:
    """Raises ImportError when matplotlib is not installed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    p = result.program
    P = p.devices
    chunk = {s: i for stages in p.plan.device_stages() for i, s in enumerate(stages)}
    most = max(int(p.order_ptr[d + 1] - p.order_ptr[d]) for d in range(P)) if P else 1
    width = min(200.0, max(10.0, most * _OP_INCHES))
    height = 1.0 + 0.6 * P
    fig, ax = plt.subplots(figsize=(width, height))
    # Fixed margins in inches (device names left, legend right): cheaper than tight_layout,
    # which draws every label once more.
    fig.subplots_adjust(
        left=0.9 / width, right=1 - 1.5 / width, bottom=0.6 / height, top=1 - 0.4 / height
    )
    scale, unit = _unit(result.iteration_time)

    bars: dict[tuple[str, int, int], list[tuple[float, float]]] = defaultdict(list)
    for op in result.ops():
        bars[(op.kind, min(chunk.get(op.stage, 0), 2), op.device)].append(
            (op.start * scale, (op.end - op.start) * scale)
        )
    for (kind, c, d), spans in bars.items():
        rgb = to_rgb(COLOURS[kind])
        ax.broken_barh(
            spans,
            (d - 0.4, 0.6),
            facecolors=tuple(x + (1 - x) * 0.35 * c for x in rgb),
            edgecolor="white",
            linewidth=0.3,
        )
    comm = defaultdict(list)
    for m in result.messages():
        for d in (m.src, m.dst) if m.end > m.start else ():
            comm[d].append((m.start * scale, (m.end - m.start) * scale))
    for coll in result.collectives():
        if coll.end > coll.start:
            comm[coll.device].append((coll.start * scale, (coll.end - coll.start) * scale))
    for d in range(P):
        if comm[d]:
            ax.broken_barh(comm[d], (d + 0.25, 0.12), facecolors=COMM_COLOUR, linewidth=0)

    # Micro-batch numbers where they fit: a digit is about 0.6 of the font size wide.
    fontsize = 7
    points_per_unit = width * 72 / (result.iteration_time * scale) if result.iteration_time else 0
    for op in result.ops() if p.num_nodes <= _MAX_LABELS else ():
        dur = (op.end - op.start) * scale
        if dur * points_per_unit >= 0.6 * fontsize * len(str(op.mb)) + 2:
            ax.text(
                (op.start + op.end) / 2 * scale,
                op.device - 0.1,
                str(op.mb),
                ha="center",
                va="center",
                fontsize=fontsize,
                color="white",
            )

    ax.set_ylim(P - 0.5, -0.6)
    ax.set_yticks(range(P), [f"device {d}" for d in range(P)])
    ax.set_xlim(0, result.iteration_time * scale)
    ax.set_xlabel(f"time ({unit})")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=max(5, int(width))))
    kinds = sorted({k for k, _, _ in bars}, key=list(COLOURS).index)
    chunked = any(c for _, c, _ in bars)
    ax.legend(
        handles=[Patch(color=COLOURS[k], label=k) for k in kinds]
        + [Patch(color=COMM_COLOUR, label="communication")],
        title="lighter: later chunk" if chunked else None,
        title_fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
    )
    ax.set_title(title or p.plan.header.name, loc="left")
    try:
        # PNG whatever the path's extension: the command line checks that it ends in .png.
        with open_atomic(path, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
    finally:
        plt.close(fig)


def _unit(seconds: float) -> tuple[float, str]:
    """A scale and unit name that keep the axis numbers readable."""
    if seconds >= 1 or seconds == 0:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"
