"""Run mypy over the package as it is installed: `python tools/typecheck.py [mypy args]`.

setup.cfg maps `octodsl.deepspeed_ext` to the folder `deepspeed_ext/` and `octodsl.grammar` to
`grammar/` (`[options] package_dir`). mypy names a file by the folders above it, so plain
`mypy deepspeed_ext` checks a top-level `deepspeed_ext` whose `from ..plan import Plan` goes
above the top ("No parent module"), and the editable install's import hook is invisible to it.
This script lets mypy read its options and `files` from pyproject.toml as usual, renames each
source under a mapped folder to its installed module name, and runs the same build the `mypy`
command runs, so messages keep the real paths (deepspeed_ext/engine.py) and the exit code is
mypy's: 0 clean, 1 errors, 2 a blocking error.
"""

from __future__ import annotations

import configparser
import os
import sys
import time
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(setup_cfg: Path) -> dict[Path, str]:
    """Folder -> installed package name, from setup.cfg's `package_dir` (identity maps left out)."""
    cfg = configparser.ConfigParser()
    cfg.read(setup_cfg)
    mapped: dict[Path, str] = {}
    for line in cfg["options"]["package_dir"].strip().splitlines():
        package, folder = (part.strip() for part in line.split("=", 1))
        if package.replace(".", "/") != folder:
            mapped[(setup_cfg.parent / folder).resolve()] = package
    return mapped


def installed_name(source: BuildSource, mapped: dict[Path, str]) -> BuildSource:
    if source.path is None:
        return source
    path = Path(source.path).resolve()
    for folder, package in mapped.items():
        if path.is_relative_to(folder):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            module = ".".join([package, *parts])
            return BuildSource(source.path, module, source.text, str(ROOT), source.followed)
    return source


def main(args: list[str]) -> int:
    os.chdir(ROOT)  # pyproject.toml's `files` are relative to the repository root
    t0 = time.time()
    fscache = FileSystemCache()
    sources, options = process_options(args, fscache=fscache)
    mapped = package_dirs(ROOT / "setup.cfg")
    sources = [installed_name(s, mapped) for s in sources]
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    _, messages, blockers = run_build(sources, options, fscache, t0, sys.stdout, sys.stderr)
    n_errors, n_notes, n_files = util.count_stats(messages)
    if n_errors:
        print(
            formatter.format_error(
                n_errors, n_files, len(sources), blockers=blockers, use_color=options.color_output
            )
        )
        return 2 if blockers else 1
    print(formatter.format_success(len(sources), options.color_output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
