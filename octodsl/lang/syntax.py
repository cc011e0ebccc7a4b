"""The syntax tree of a .octo file: what was written, compact forms and comments included.

`fmt` prints this tree; `lower` turns it into a `Plan`. Every node carries its Span (a block's
ends at its closing brace, so comments before the brace stay inside the block).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..plan import Span

SUPPRESSION = re.compile(r"#\s*octodsl\s*:", re.I)
"""How a suppression comment starts (`# octodsl: ignore[W401]`); any comment that starts so is
read as one."""


@dataclass(slots=True)
class Comment:
    text: str
    span: Span

    @property
    def suppresses(self) -> bool:
        """Whether this is a suppression comment, which acts on the line it ends."""
        return SUPPRESSION.match(self.text) is not None


# -- expressions (stage and micro-batch indices) ---------------------------------------------


@dataclass(slots=True)
class Num:
    value: int
    span: Span


@dataclass(slots=True)
class Var:
    name: str
    span: Span


@dataclass(slots=True)
class BinOp:
    op: str
    """One of + - *."""
    left: Expr
    right: Expr
    span: Span


Expr = Num | Var | BinOp


# -- header ------------------------------------------------------------------------------------


@dataclass(slots=True)
class HeaderEntry:
    key: str
    value: int | float | str
    kind: str
    """How the value was written: int, size, string or name."""
    text: str
    """The value exactly as written (sizes keep their unit)."""
    span: Span
    value_span: Span


@dataclass(slots=True)
class PlanBlock:
    name: str
    entries: list[HeaderEntry]
    span: Span


# -- partition ---------------------------------------------------------------------------------


@dataclass(slots=True)
class StageDecl:
    index: int
    first: int
    last: int
    span: Span


@dataclass(slots=True)
class PartitionLayers:
    stages: list[StageDecl]
    span: Span


@dataclass(slots=True)
class PartitionPattern:
    pattern: str
    """The string's content, without quotes."""
    span: Span
    value_span: Span


@dataclass(slots=True)
class PartitionAbstract:
    count: int
    span: Span


# -- placement ---------------------------------------------------------------------------------


@dataclass(slots=True)
class DevicePlace:
    device: int
    stages: list[int]
    span: Span


@dataclass(slots=True)
class PlacementExplicit:
    entries: list[DevicePlace]
    span: Span


@dataclass(slots=True)
class PlacementNamed:
    name: str
    span: Span


# -- recompute ---------------------------------------------------------------------------------


@dataclass(slots=True)
class RecomputeEntry:
    """`stage N: MODE` as written; the mode is checked when lowered."""

    stage: int
    mode: str
    span: Span
    mode_span: Span


@dataclass(slots=True)
class RecomputeBlock:
    entries: list[RecomputeEntry]
    span: Span


# -- schedule ----------------------------------------------------------------------------------


@dataclass(slots=True)
class OpItem:
    kind: str
    stage: Expr
    mb: Expr
    mb_last: Expr | None
    """Set for a range `mb..mb_last`."""
    span: Span


@dataclass(slots=True)
class Overlap:
    ops: list[OpItem]
    span: Span


@dataclass(slots=True)
class Loop:
    var: str
    first: Expr
    last: Expr
    body: list[Item]
    span: Span


Item = OpItem | Overlap | Loop


@dataclass(slots=True)
class DeviceBlock:
    device: int
    items: list[Item]
    span: Span


@dataclass(slots=True)
class ScheduleBlock:
    devices: list[DeviceBlock]
    span: Span


Section = (
    PartitionLayers
    | PartitionPattern
    | PartitionAbstract
    | PlacementExplicit
    | PlacementNamed
    | RecomputeBlock
    | ScheduleBlock
)


@dataclass(slots=True)
class File:
    plan: PlanBlock
    sections: list[Section]
    comments: list[Comment] = field(default_factory=list)
    blank_lines: frozenset[int] = frozenset()
    """Source lines holding nothing but whitespace (fmt keeps one blank line for a run of them)."""
