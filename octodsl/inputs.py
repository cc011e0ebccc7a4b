"""Reading the files a user gives: every input octodsl reads (a plan, a CSV, a model spec, a
Hugging Face config, a profile, a trace, a device or link file) goes through here.

Whatever the path names, the answer is its text or data, or one OctoError naming the path and
what is wrong: an empty path, a missing file, a folder, something that is not a regular file
(a FIFO or `/dev/zero` would hang or never end: refused before it is opened), a file larger
than the kind's limit (read no further than that), bytes that are not UTF-8, and for data files
YAML or JSON that does not parse (with the line and column), is nested too deep for Python's
parsers, or holds a number of thousands of digits, which Python refuses to read.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import yaml

from . import limits
from .errors import OctoError
from .units import exact_size


class InputError(OctoError):
    """A file that cannot be read as the input it was given as."""


def read_text(
    path: str | os.PathLike,
    what: str,
    *,
    max_bytes: int = limits.MAX_FILE_BYTES,
    error: type[OctoError] = InputError,
) -> str:
    """The UTF-8 text of the regular file `path` (`-`: standard input) of at most `max_bytes`;
    otherwise `error`, naming the path, saying why (`what`: the kind of file, e.g. "profile")."""
    shown = str(path)

    def refuse(why: str) -> OctoError:
        return error(why, path=shown or "''")

    if not shown:
        raise refuse(f"an empty path names no {what}")
    try:
        if shown == "-":
            raw = sys.stdin.buffer.read(max_bytes + 1)
        else:
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                raise refuse(f"is a folder, not a {what}")
            if not stat.S_ISREG(st.st_mode):
                raise refuse(
                    f"is not a regular file (a FIFO or a device cannot be read as a {what})"
                )
            if st.st_size > max_bytes:
                raise refuse(
                    f"is {st.st_size:,} bytes; a {what} is at most {exact_size(max_bytes)}"
                )
            with open(path, "rb") as f:
                raw = f.read(max_bytes + 1)  # it may have grown since
    except FileNotFoundError:
        raise refuse(f"no such {what}") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        raise refuse(f"cannot read it: {getattr(e, 'strerror', None) or e}") from None
    if len(raw) > max_bytes:
        raise refuse(f"is more than {exact_size(max_bytes)}; a {what} is at most that")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise refuse(f"not UTF-8 text (byte {e.start:,} is 0x{raw[e.start]:02x})") from None


def is_json(path: str | os.PathLike) -> bool:
    """A `.json` path is JSON; any other data file is YAML."""
    return Path(path).suffix.lower() == ".json"


def parse_data(
    text: str, path: str, *, json_file: bool, error: type[OctoError] = InputError
) -> object:
    """`text` parsed as JSON or YAML; `error` naming `path` and, for a syntax error, the line
    and column."""
    language = "JSON" if json_file else "YAML"
    try:
        return json.loads(text) if json_file else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        why = f"{e.msg} at line {e.lineno}, column {e.colno}"
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        why = f"{getattr(e, 'problem', None) or type(e).__name__}{where}"
    except RecursionError:
        why = "nested too deep"
    except ValueError as e:  # Python reads no whole number of 4,300 digits or more
        why = "a number of 4,300 digits or more" if "digits" in str(e) else str(e)[:100]
    raise error(f"not valid {language}: {why}", path=path)


def read_data(
    path: str | os.PathLike,
    what: str,
    *,
    max_bytes: int = limits.MAX_FILE_BYTES,
    error: type[OctoError] = InputError,
    json_file: bool | None = None,
) -> object:
    """The parsed JSON or YAML of a file (`json_file` None: JSON for a `.json` path):
    read_text, then parse_data."""
    text = read_text(path, what, max_bytes=max_bytes, error=error)
    return parse_data(
        text, str(path), json_file=is_json(path) if json_file is None else json_file, error=error
    )


def kind_of(value: object) -> str:
    """How a refusal names what a file gave instead of a number, a text or a mapping."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return str(value).lower()
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "text"}
    return names.get(type(value), type(value).__name__)
