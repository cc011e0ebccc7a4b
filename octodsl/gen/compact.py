"""Write a device's slots as few .octo items: micro-batch runs become ranges (`F0:0..3`),
repeated groups become one-line loops (`for i in 0..3 { F0:i+4 BW0:i }`).

A group of k slots repeats when each later copy has the same kinds and stages and every
micro-batch one higher. Greedy from the left: at each position, take the form that covers the
most slots (ties: the shortest group)."""

from __future__ import annotations

from ..plan import Op, Slot

MAX_PERIOD = 8
"""Longest repeated group looked for (ZB-V's steady group has 6 slots)."""
MIN_LOOP = 3
"""Repeats below this stay written out: a loop of two is harder to read than its four ops."""


def compact(slots: list[Slot]) -> list[str]:
    items: list[str] = []
    i = 0
    while i < len(slots):
        k, r = _best_repeat(slots, i)
        if k == 1 and r >= 2 and not slots[i].overlapped:
            op = slots[i].ops[0]
            items.append(f"{op.label}..{op.mb + r - 1}")
        elif r >= MIN_LOOP:
            items.append(_loop(slots[i : i + k], r))
        else:
            k, r = 1, 1
            items.append(str(slots[i]))
        i += k * r
    return items


def _best_repeat(slots: list[Slot], i: int) -> tuple[int, int]:
    """(k, r): the group of k slots at i that repeats r times covering the most slots."""
    best = (1, _repeats(slots, i, 1))
    for k in range(2, MAX_PERIOD + 1):
        r = _repeats(slots, i, k)
        if r >= MIN_LOOP and k * r > best[0] * best[1]:
            best = (k, r)
    return best


def _repeats(slots: list[Slot], i: int, k: int) -> int:
    r = 1
    while i + (r + 1) * k <= len(slots) and all(
        _shifted(slots[i + j], slots[i + r * k + j], r) for j in range(k)
    ):
        r += 1
    return r


def _shifted(a: Slot, b: Slot, by: int) -> bool:
    return len(a.ops) == len(b.ops) and all(
        x.kind is y.kind and x.stage == y.stage and y.mb == x.mb + by
        for x, y in zip(a.ops, b.ops, strict=True)
    )


def _loop(group: list[Slot], r: int) -> str:
    """`for i in a..b { ... }` with a the smallest micro-batch of the first copy, so every
    micro-batch is written `i` or `i+c`."""
    start = min(op.mb for slot in group for op in slot.ops)

    def op_text(op: Op) -> str:
        off = op.mb - start
        return f"{op.kind.value}{op.stage}:i" + (f"+{off}" if off else "")

    body = " ".join(
        op_text(s.ops[0]) if not s.overlapped else "(" + " & ".join(op_text(o) for o in s.ops) + ")"
        for s in group
    )
    return f"for i in {start}..{start + r - 1} {{ {body} }}"
