"""Finding a model spec by built-in name or file path (YAML or JSON)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from .. import limits
from ..errors import OctoError
from ..inputs import kind_of, read_data
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


_MAX_PROBLEMS = 10
"""Problems a refusal lists; a file of 20,000 bad layers is still one readable line."""


def _problems(e: ValidationError) -> str:
    """The errors on one line. A block's field (`attention: {heads: ...}`) is a field of every
    layer of its kind the pattern expands to, and a list of layers can be wrong in each of them:
    the error it makes in each is said once, with the layers it is in."""
    grouped: dict[tuple[str, str], list[str | None]] = {}
    for err in e.errors():
        loc = [str(p) for p in err["loc"]]
        layer = loc[1] if len(loc) > 1 and loc[0] == "layers" and loc[1].isdigit() else None
        where = ".".join(loc[2:] if layer else loc)
        msg = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
        if err["type"] == "less_than_equal" and isinstance(err["ctx"]["le"], int):
            msg = f"{err['input']!r:.20} is too large: must be {limits.at_most(err['ctx']['le'], '')}"
        grouped.setdefault((where, msg), []).append(layer)
    parts = []
    for (where, msg), layers in grouped.items():
        field = f".{where}" if where else ""
        if not where and layers[0] is None:  # the spec's own check, whose message names its fields
            parts.append(msg)
        elif layers[0] is None:
            parts.append(f"{where}: {msg}")
        elif len(layers) == 1:
            parts.append(f"layers.{layers[0]}{field}: {msg}")
        else:
            more = f" and {len(layers) - 3:,} more" if len(layers) > 3 else ""
            which = f"layers {', '.join(map(str, layers[:3]))}{more}"
            parts.append(f"{where} ({which}): {msg}" if where else f"{which}: {msg}")
    if len(parts) > _MAX_PROBLEMS:
        parts[_MAX_PROBLEMS:] = [f"and {len(parts) - _MAX_PROBLEMS:,} more problems"]
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
    if not name_or_path:
        raise SpecError("an empty name ('') names no model: give a built-in's name "
                        f"({', '.join(BUILTINS)}), a spec file or hf:PATH")
    path = Path(name_or_path)
    if not path.exists() and not path.is_symlink():
        raise SpecError(f"no built-in model or spec file {name_or_path!r} "
                        f"(built-ins: {', '.join(BUILTINS)})")
    data = read_data(path, "model spec", error=SpecError)
    if not isinstance(data, dict):
        raise SpecError(f"a model spec is a mapping of fields, not {kind_of(data)}", path=str(path))
    data.setdefault("name", path.stem)
    return parse_model(data, str(path))
