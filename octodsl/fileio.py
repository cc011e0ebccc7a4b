"""Writing files so that nothing is lost: every file octodsl writes goes through here.

`write_atomic(path, data)` writes a temporary file beside `path`, flushes it to disk and renames
it over `path` in one step, so a full disk, a quota or an interrupt leaves the old file whole
(a plan `octodsl fmt` rewrites in place, a profile `calibrate -o` replaces) and never a
truncated one. `open_atomic` is the same for writers that want a file object (matplotlib).
`unwritable(path)` and `unwritable_folder(path)` say beforehand why a write would fail, so that
a long job (a search, a benchmark) refuses at its start instead of losing its result at its end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Replace `path` with `data` (text is written as UTF-8) or leave it as it was; raises
    OSError when it cannot be written."""
    with open_atomic(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """A file object whose contents replace `path` when the block ends without an exception;
    on any exception the temporary file is removed and `path` is untouched.

    The new file keeps the permission bits of the file it replaces (a new one gets the
    umask's); a read-only file is refused (PermissionError), as open() would. A symbolic link
    is written through: its target is replaced, the link stays."""
    if mode not in ("w", "wb"):
        raise ValueError(f"open_atomic writes whole files ('w' or 'wb'), not {mode!r}")
    target = Path(os.path.realpath(path))
    if target.exists() and not os.access(target, os.W_OK):
        # A rename would replace a file its owner made read-only: refuse as open() would.
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    temp, fd = _create_temporary(target)
    try:
        f: IO = os.fdopen(fd, "wb") if mode == "wb" else os.fdopen(fd, "w", encoding="utf-8")
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(temp, os.stat(target).st_mode & 0o7777)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _sync_folder(target.parent)


def unwritable(path: str | os.PathLike) -> str | None:
    """Why a file cannot be written at `path`, in one line naming it ("cannot write out/t.md:
    there is no folder out"), or None when `write_atomic` can write it. The folder must exist
    (`write_atomic` makes none) and take new files (the temporary one), and a file already
    there must be writable (`open_atomic` refuses a read-only one)."""
    text = os.fspath(path)
    if not text:
        return "no file name given"
    if text.endswith(("/", os.sep)):  # `out/` would be written as the file `out`
        return f"cannot write {text}: it ends in '/': give a file's name, not a folder's"
    if os.path.isdir(text):
        return f"cannot write {text}: it is a folder"
    folder = os.path.dirname(os.path.realpath(text))
    shown = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        return f"cannot write {text}: there is no folder {shown}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write {text}: the folder {shown} is not writable"
    if os.path.exists(text) and not os.access(text, os.W_OK):
        return f"cannot write {text}: it is read-only"
    return None


def unwritable_folder(path: str | os.PathLike) -> str | None:
    """Why files cannot be written into the folder `path`, made with its parents where missing
    (`mkdir(parents=True)`), in one line naming it; None when they can."""
    text = os.fspath(path)
    if not text:
        return "no folder name given"
    existing = Path(os.path.realpath(text))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot write {text}: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot write {text}: the folder {existing} is not writable"
    return None


def _create_temporary(target: Path) -> tuple[Path, int]:
    """A new file in the target's folder (a rename is atomic only within one filesystem),
    hidden and named after the target so a leftover is recognisable."""
    while True:
        temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            # 0o666 less the umask: the mode a plain open() would give a new file.
            return temp, os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable; some systems cannot open a folder, which is no error."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
