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
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}" for err in e.errors())
        raise SpecError(f"{source}: invalid model spec: {problems}") from None


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
