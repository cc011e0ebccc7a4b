"""Finding a model spec by built-in name or file path (YAML or JSON)."""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path

from ..inputs import kind_of, read_data
from .builtin import BUILTINS
from .hf import load_hf
from .parse import SpecError, parse_model
from .spec import ModelSpec


def builtin_models() -> list[str]:
    """Names of the built-in models."""
    return list(BUILTINS)


@cache
def _builtin(name: str) -> ModelSpec:
    return parse_model(BUILTINS[name], f"built-in {name}")


HF_PREFIX = "hf:"
"""`hf:PATH` names a Hugging Face config.json (or a folder holding one) as a model."""


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in model by name, a spec file (`.yaml`, `.yml` or `.json`) by path, or
    `hf:PATH`, a Hugging Face config (octodsl.models.hf).

    Raises SpecError when neither exists or the file is not a valid spec. Specs are immutable;
    a built-in is parsed once and the same object returned every time, a file once while its
    modification time and size stay the same."""
    if name_or_path in BUILTINS:
        return _builtin(name_or_path)
    if name_or_path.startswith(HF_PREFIX):
        return load_hf(name_or_path.removeprefix(HF_PREFIX))
    if not name_or_path:
        raise SpecError(
            "an empty name ('') names no model: give a built-in's name "
            f"({', '.join(BUILTINS)}), a spec file or hf:PATH"
        )
    path = Path(name_or_path)
    if not path.exists() and not path.is_symlink():
        raise SpecError(
            f"no built-in model or spec file {name_or_path!r} (built-ins: {', '.join(BUILTINS)})"
        )
    try:
        stat = path.stat()
    except OSError:  # a dangling link: reading it says why, in one line
        return _read_spec(name_or_path)
    return _spec_file(name_or_path, str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)
def _spec_file(name_or_path: str, resolved: str, mtime_ns: int, size: int) -> ModelSpec:
    """A spec file parsed once while it stays the same file: the cluster search costs hundreds of
    configurations of one model, each asking for its spec (keyed by the file it resolves to, its
    modification time and size, so an edited file is read again)."""
    return _read_spec(name_or_path)


def _read_spec(name_or_path: str) -> ModelSpec:
    path = Path(name_or_path)
    data = read_data(path, "model spec", error=SpecError)
    if not isinstance(data, dict):
        raise SpecError(f"a model spec is a mapping of fields, not {kind_of(data)}", path=str(path))
    data.setdefault("name", path.stem)
    return parse_model(data, str(path))
