"""`octodsl` command line: a thin entry point that dispatches to one module per command.

Each command module defines `register(subparsers)`, which adds its parser and sets
`func(args) -> int` (the exit code). Errors meant for the user are `OctoError`s, raised where
they are found and printed here, the one place, without a traceback unless `--debug` is given.
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import io
import os
import sys

from ..errors import OctoError
from .common import Parser

# Module names under octodsl.cli, one per command, in the order `--help` lists them.
COMMANDS = (
    "lint",
    "fmt",
    "gen",
    "convert",
    "simulate",
    "models",
    "devices",
    "profile",
    "tune",
    "compare",
    "calibrate",
    "completion",
)


class _Version(argparse.Action):
    """--version: print `octodsl X.Y.Z` and exit 0 (argparse's own action would look the
    version up on every run, not only when asked)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print octodsl's version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from ..version import version

        print(f"octodsl {version()}")
        parser.exit(0)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given argv naming a command, only that command's module is imported (some
    pull in heavy libraries that `octodsl lint` should not pay for), and none for `--version`."""
    chosen = next((a for a in argv or () if not a.startswith("-")), None)
    asks_version = chosen is None and "--version" in (argv or ())
    names = [chosen] if chosen in COMMANDS else () if asks_version else COMMANDS
    parser = Parser(
        prog="octodsl",
        description="Plan, check, simulate, tune and run pipeline-parallel training of hybrid LLMs.",
    )
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in names:
        importlib.import_module(f"{__name__}.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # A plan of 10k+ ops allocates many small objects that all live until exit; the default
    # collector thresholds would walk them again and again (a third of lint's time).
    gc.set_threshold(100_000, 50, 100)
    own_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    # Known before parsing: a bad option value is reported like every other error.
    debug = "--debug" in argv
    try:
        try:
            args = build_parser(argv).parse_args(argv)
            status = int(args.func(args) or 0)
        except SystemExit:  # --help, --version: their text is out (or its failure seen) first
            sys.stdout.flush()
            raise
        # Flushed here, not at exit: a full disk is then one line like every other error.
        sys.stdout.flush()
        # The interpreter's last collections at exit walk every object still alive: after a
        # search that is most of a second (tune --budget bounds the command's wall time).
        # Frozen objects are not walked, and none of them is needed any more. Only when this is
        # the process's command line: a caller's (a test's) later cycles must stay collectable.
        if own_process:
            gc.freeze()
        return status
    except OctoError as e:
        if debug:
            raise
        print(f"octodsl: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do.
        _discard_stdout()
        return 0
    except KeyboardInterrupt:
        print("octodsl: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        # Every file a command writes turns its OSError into an OctoError (cli.common.writing);
        # what is left is standard output: a full disk, a quota, /dev/full.
        if debug or e.errno not in _CANNOT_WRITE:
            return _internal_error(e, debug)
        _discard_stdout()
        print(f"octodsl: error: standard output: cannot write: {e.strerror}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the one place an unexpected error is turned into a message
        return _internal_error(e, debug)


_CANNOT_WRITE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}
"""The errors of writing to standard output that are the disk's, not octodsl's."""


def _internal_error(e: Exception, debug: bool) -> int:
    if debug:
        raise e
    print(
        f"octodsl: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
        file=sys.stderr,
    )
    return 3


def _discard_stdout() -> None:
    """Send what standard output still buffers to /dev/null, so that the flush at exit does
    not fail again (Python's advice for a closed pipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        sys.stdout = open(os.devnull, "w")  # no descriptor (a test's capture): replace it


if __name__ == "__main__":
    sys.exit(main())
