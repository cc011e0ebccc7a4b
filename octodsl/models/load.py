"""Finding a model spec by built-in name or file path (YAML or JSON)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import ValidationError

from ..errors import OctoError
from .builtin import BUILTINS
from .spec import ModelSpec


class SpecError(OctoError):
    """A model that cannot be found or whose spec is invalid; the message is for the user."""


def builtin_models() -> list[str]:
    """Names of the built-in models."""
    return list(BUILTINS)


def parse_model(data: dict, source: str) -> ModelSpec:
    """Validate a spec given as a dict (a parsed file); SpecError says what is wrong where."""
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"{source}: invalid model spec: {_problems(e)}") from None


def _problems(e: ValidationError) -> str:
    """The errors on one line. A block's field (`attention: {heads: ...}`) is a field of every
    layer of its kind the pattern expands to: the error it makes in each of them is said once,
    with the layers it is in."""
    grouped: dict[tuple[str, str], list[str | None]] = {}
    for err in e.errors():
        loc = [str(p) for p in err["loc"]]
        layer = loc[1] if len(loc) > 2 and loc[0] == "layers" and loc[1].isdigit() else None
        where = ".".join(loc[2:] if layer else loc) or "spec"
        grouped.setdefault((where, err["msg"]), []).append(layer)
    parts = []
    for (where, msg), layers in grouped.items():
        if layers[0] is None:
            parts.append(f"{where}: {msg}")
        elif len(layers) == 1:
            parts.append(f"layers.{layers[0]}.{where}: {msg}")
        else:
            more = f" and {len(layers) - 3} more" if len(layers) > 3 else ""
            parts.append(f"{where} (layers {', '.join(map(str, layers[:3]))}{more}): {msg}")
    return "; ".join(parts)


@lru_cache(maxsize=None)
def _builtin(name: str) -> ModelSpec:
    return parse_model(BUILTINS[name], f"built-in {name}")


HF_PREFIX = "hf:"
"""`hf:PATH` names a Hugging Face config.json (or a folder holding one) as a model."""


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in model by name, a spec file (`.yaml`, `.yml` or `.json`) by path, or
    `hf:PATH`, a Hugging Face config (octodsl.models.hf).

    Raises SpecError when neither exists or the file is not a valid spec. Specs are immutable;
    a built-in is parsed once and the same object returned every time."""
    if name_or_path in BUILTINS:
        return _builtin(name_or_path)
    if name_or_path.startswith(HF_PREFIX):
        from .hf import load_hf

        return load_hf(name_or_path.removeprefix(HF_PREFIX))
    path = Path(name_or_path)
    if not path.is_file():
        raise SpecError(f"no built-in model or spec file {name_or_path!r} "
                        f"(built-ins: {', '.join(BUILTINS)})")
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: cannot read the model spec: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a model spec is a mapping of fields, not {type(data).__name__}")
    data.setdefault("name", path.stem)
    return parse_model(data, str(path))
