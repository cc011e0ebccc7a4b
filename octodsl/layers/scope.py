"""A process group layers read when they are built: `current()` at construction, set for a block
by `building(group)`, as DeepSpeed builds a PipelineModule's layers from LayerSpecs. The tp group
(`tensor_parallel`) and the ep group (`expert_parallel`) are each one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Generic, TypeVar

_Group = TypeVar("_Group")


class BuildScope(Generic[_Group]):
    """The group layers built now are for: `default` outside any `building` block."""

    def __init__(self, default: _Group):
        self._current = default

    def current(self) -> _Group:
        """The group of the innermost `building` block (the default outside one)."""
        return self._current

    @contextlib.contextmanager
    def building(self, group: _Group) -> Iterator[_Group]:
        """Build layers for `group` inside the block."""
        before, self._current = self._current, group
        try:
            yield group
        finally:
            self._current = before
