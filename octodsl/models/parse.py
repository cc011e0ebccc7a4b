"""A model spec from its parsed fields: the validation both a spec file (`load`) and a Hugging
Face config (`hf`) end in, and the error it raises."""

from __future__ import annotations

from pydantic import ValidationError

from .. import limits
from ..errors import OctoError
from .spec import ModelSpec


class SpecError(OctoError):
    """A model that cannot be found or whose spec is invalid; the message is for the user."""


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
            msg = (
                f"{err['input']!r:.20} is too large: must be {limits.at_most(err['ctx']['le'], '')}"
            )
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
