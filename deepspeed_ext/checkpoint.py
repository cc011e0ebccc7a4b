"""Checkpoints the executor can trust (`Checkpoints`, a part of OctoPipeEngine).

- `check_save_dir(path)`, before training: every rank creates the folder and writes and removes
  a probe file there, so that a place that cannot be written fails at once, naming the rank,
  instead of after the last step.
- `save_checkpoint` records the plan's layout (partition and placement) in the checkpoint's
  client state. When writing fails on some rank (a full disk), every rank raises the same
  CheckpointError naming it; `latest` only ever names a checkpoint every rank wrote, so the one
  before stays loadable.
- `load_checkpoint` refuses, before it reads any weights, a folder without a checkpoint and a
  checkpoint of another layout (the message names both layouts): DeepSpeed would train from
  scratch, or fail deep in the optimizer's state.
- With ep, the ranks of data-parallel copies 0 .. ep - 1 hold every expert between them: each
  writes its own files, the layers' (`layer_XX-ep_YY-...`, module.py) and its optimizer state's
  (`ep_rank_YY_mp_rank_...`; ep rank 0 keeps DeepSpeed's name, so the layout of a checkpoint of
  any ep is read from the same file), and loads its own. The layout records ep.

Each check gathers every rank's verdict (`agree`), so all ranks raise together and none is left
waiting in a collective.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..errors import OctoError
from ..fileio import write_atomic
from ..units import size
from .errors import CheckpointError

LAYOUT_KEY = "octodsl_layout"
"""The client-state entry holding the layout a checkpoint was saved with."""

if TYPE_CHECKING:  # the engine this mixes into (untyped: its attributes are Any to mypy)
    from deepspeed.runtime.pipe.engine import PipelineEngine as _Engine
else:
    _Engine = object


class Checkpoints(_Engine):
    """Checkpoint methods of OctoPipeEngine (a DeepSpeed PipelineEngine with `plan` and an
    OctoPipeModule)."""

    _writing_checkpoint = False
    """Between DeepSpeed's last collective of a save and the barrier that ends it: a rank that
    fails there can still meet the others at that barrier."""

    def layout(self) -> dict:
        """What a checkpoint's files depend on: the layers of each stage and their devices, and
        the tp and ep degrees (each tp rank saves its shards, each ep rank its experts; absent at
        1, as before tp and ep existed)."""
        tp, ep = self.plan.header.tp, self.plan.header.ep
        return {
            "stages": [[r.start, r.stop - 1] for r in self.module.stage_ranges],
            "devices": list(self.module.stage_device),
            **({"tp": tp} if tp > 1 else {}),
            **({"ep": ep} if ep > 1 else {}),
        }

    def _configure_checkpointing(self):
        super()._configure_checkpointing()
        ep = self.module.ep  # copies 0 .. ep - 1 hold different experts and optimizer states
        if ep.size > 1 and self.mpu.get_data_parallel_rank() < ep.size:
            self.save_non_zero_checkpoint = True

    def _get_ckpt_name(self, checkpoints_path, tag, mp_placeholder=None, pp_placeholder=None):
        name = super()._get_ckpt_name(checkpoints_path, tag, mp_placeholder, pp_placeholder)
        ep = self.module.ep
        if ep.rank == 0:
            return name
        folder, file = os.path.split(name)
        return os.path.join(folder, f"ep_rank_{ep.rank:02d}_{file}")

    def check_save_dir(self, path: str | os.PathLike) -> None:
        """Collective: CheckpointError on every rank unless every rank can create the folder and
        write a file in it."""
        agree(probe_dir(Path(path)), f"cannot save checkpoints in {path}")

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True, **kwargs):
        """DeepSpeed's save_checkpoint with the layout recorded; CheckpointError on every rank
        when some rank cannot write in `save_dir` (`check_save_dir`) or could not write its part
        (`latest` then still names the checkpoint before)."""
        self.check_save_dir(save_dir)
        tag = str(f"global_step{self.global_steps}" if tag is None else tag)
        state = {**(client_state or {}), LAYOUT_KEY: self.layout()}
        problem = None
        try:
            super().save_checkpoint(save_dir, tag, state, save_latest=False, **kwargs)
        except (OSError, RuntimeError) as e:
            if not self._writing_checkpoint:
                raise
            problem = _write_problem(e, Path(save_dir))
            dist.barrier()  # the barrier that ends the save on the other ranks
        finally:
            self._writing_checkpoint = False
        failed = f"saving checkpoint {tag} in {save_dir} failed"
        agree(problem, failed)
        if save_latest:
            problem = None
            if self.global_rank == 0:
                try:
                    write_atomic(Path(save_dir) / "latest", tag)
                except OSError as e:
                    problem = _os_problem(e)
            agree(problem, failed)
        return True

    def _checkpoint_tag_validation(self, tag):
        super()._checkpoint_tag_validation(tag)
        self._writing_checkpoint = True  # no collective from here to the barrier that ends the save

    def load_checkpoint(self, load_dir, tag=None, **kwargs):
        """DeepSpeed's load_checkpoint, after checking on every rank that `load_dir` holds the
        checkpoint (`tag`, else the one `latest` names) and that it was saved with this plan's
        layout; CheckpointError on every rank otherwise."""
        problem, tag = self._load_problem(Path(load_dir), tag)
        agree(problem, f"cannot load a checkpoint from {load_dir}")
        return super().load_checkpoint(load_dir, tag, **kwargs)

    def _load_problem(self, load_dir: Path, tag) -> tuple[str | None, str | None]:
        """What is wrong with loading `tag` from `load_dir` here (None: nothing), and the tag."""
        if not load_dir.is_dir():
            return "no such folder", tag
        if tag is None:
            latest = load_dir / "latest"
            if not latest.is_file():
                return "it holds no checkpoint (no 'latest' file naming one)", None
            tag = latest.read_text().strip()
        tag = str(tag)
        if not (load_dir / tag).is_dir():
            return f"checkpoint {tag} is not there (no folder {load_dir / tag})", tag
        # ep rank 0's files, DeepSpeed's names, which a checkpoint of every ep has
        files = sorted(glob.glob(super()._get_ckpt_name(str(load_dir), tag, mp_placeholder="*")))
        if not files:
            return f"checkpoint {tag} has no model-state files (mp_rank_*_model_states.pt)", tag
        try:
            saved = torch.load(files[0], map_location="cpu", mmap=True, weights_only=False).get(
                LAYOUT_KEY
            )
        except (OSError, RuntimeError, EOFError, AttributeError) as e:
            return f"cannot read {files[0]}: {e}", tag
        mine = self.layout()
        if saved is None:
            return (
                f"checkpoint {tag} records no layout (it was not saved by the octodsl executor), "
                f"so it cannot be checked against this plan's {describe_layout(mine)}"
            ), tag
        if saved != mine:
            return (
                f"checkpoint {tag} was saved with {describe_layout(saved)}, but this plan runs "
                f"{describe_layout(mine)}; resume with a plan of the checkpoint's partition and "
                "placement"
            ), tag
        return None, tag


def describe_layout(layout: dict) -> str:
    """'2 stages (layers 0..11, 12..23) on devices 0, 1' (', each a tp group of 2', ', experts
    over ep 2')."""
    stages = layout["stages"]
    tp, ep = layout.get("tp", 1), layout.get("ep", 1)
    return (
        f"{len(stages)} stage{'s' if len(stages) != 1 else ''} (layers "
        f"{', '.join(f'{a}..{b}' for a, b in stages)}) on devices "
        f"{', '.join(map(str, layout['devices']))}"
        + (f", each a tp group of {tp}" if tp > 1 else "")
        + (f", experts over ep {ep}" if ep > 1 else "")
    )


def agree(problem: str | None, what: str, error: type[OctoError] = CheckpointError) -> None:
    """Collective: gather every rank's problem (None: none) and raise `error` on every rank if
    any has one, naming the ranks."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, problem)
    by_text: dict[str, list[int]] = {}
    for rank, text in enumerate(gathered):
        if text is not None:
            by_text.setdefault(text, []).append(rank)
    if by_text:
        raise error(
            f"{what}: "
            + "; ".join(
                f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {text}"
                for text, ranks in by_text.items()
            )
        )


def probe_dir(path: Path) -> str | None:
    """Why this rank cannot write in `path` (None: it can), after creating it."""
    probe = path / f".octodsl-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"octodsl")
        probe.unlink()
    except OSError as e:
        return _os_problem(e)
    return None


def _write_problem(error: Exception, save_dir: Path) -> str:
    """One line on a failed write, with the space left (torch.save only says that it failed)."""
    text = (
        _os_problem(error)
        if isinstance(error, OSError)
        else re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", str(error)).splitlines()[0]
    )
    try:
        free = f"; {size(shutil.disk_usage(save_dir).free)} free there"
    except OSError:
        free = ""
    return f"writing its files failed ({text}){free}"


def _os_problem(e: OSError) -> str:
    return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
