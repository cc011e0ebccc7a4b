"""DeepSpeed PipelineModules cut exactly where a plan says.

`OctoPipeModule` builds every stage its rank holds (any number, any stage-to-rank mapping), the
pattern of DeepSpeed's DualPipeVModule generalised; `FixedPartitionModule` is DeepSpeed's own
one-stage-per-rank module with given boundaries, for stock comparisons.
"""

from __future__ import annotations

import glob
import os
from contextlib import contextmanager
from functools import partial
from types import SimpleNamespace

import torch
from deepspeed.runtime import utils as ds_utils
from deepspeed.runtime.pipe.module import PipelineModule
from torch import nn

from ..layers import expert_parallel, tensor_parallel
from ..layers.expert_parallel import EpGroup
from ..plan import Plan
from .mesh import expert_groups, tp_group


def as_leaf(value):
    """A stage input: detached from the producer's graph; float tensors require grad."""
    if torch.is_tensor(value):
        return value.detach().requires_grad_(value.is_floating_point())
    return tuple(as_leaf(t) for t in value)


class OctoPipeModule(PipelineModule):
    """A PipelineModule cut into the plan's stages (`stage_ranges[s]`: the layers of stage s);
    this rank builds the stages its device holds, in layer order, so that a tied module is built
    at its first layer as DeepSpeed does."""

    def __init__(self, layers, plan: Plan, stage_ranges: list[range], **kwargs):
        self.plan = plan
        self.stage_ranges = stage_ranges
        self.stage_device = plan.stage_device()
        super().__init__(layers, num_stages=plan.devices, **kwargs)

    def _partition_layers(self, method=None):
        self.parts = [r.start for r in self.stage_ranges] + [self.stage_ranges[-1].stop]
        device = self._topo.get_coord(self.global_rank).pipe
        self.local_stages = [s for s, d in enumerate(self.stage_device) if d == device]
        if self.global_rank == 0:
            for s, r in enumerate(self.stage_ranges):
                names = " ".join(layer_name(self._layer_specs[i]) for i in r)
                print(
                    f"stage={s} device={self.stage_device[s]} layers={r.start}..{r.stop - 1}: {names}"
                )

    def stage_owner(self, layer_idx: int) -> int:
        """The device (pipe rank) that holds `layer_idx`."""
        for s, r in enumerate(self.stage_ranges):
            if layer_idx in r:
                return self.stage_device[s]
        raise IndexError(f"layer {layer_idx} is in no stage")

    def _build(self):
        # the layers read the tp and ep groups at construction (octodsl.layers.tensor_parallel,
        # expert_parallel); an ep MoE layer draws every expert's init and keeps its own
        self.tp = tp_group(self._grid, self.plan.header.sp)
        self.ep = expert_groups(self._grid, self.plan.header.ep)
        self.stage_funcs: dict[int, list] = {}
        with tensor_parallel.building(self.tp), expert_parallel.building(self.ep):
            for s in self.local_stages:
                self._set_bounds(self.stage_ranges[s].start, self.stage_ranges[s].stop)
                super()._build()
                self.stage_funcs[s] = self.forward_funcs
                self.forward_funcs: list = []
        self.activate(self.local_stages[0])

    def activate(self, stage: int) -> None:
        """Expose `stage` as the module's layers (forward, checkpoint files)."""
        self.forward_funcs = self.stage_funcs[stage]
        self._local_start, self._local_stop = (
            self.stage_ranges[stage].start,
            self.stage_ranges[stage].stop,
        )
        if self.activation_checkpoint_interval > 0:  # the parent caches this per layer list
            self.is_checkpointable_results_interval = None
            self._precompute_checkpointable_values()

    def stage_layer_params(self, stage: int) -> list[tuple[int, list[nn.Parameter]]]:
        """(layer index, trainable parameters) of each layer of the stage; a tied layer's
        parameters are those of its shared module."""
        out = []
        for i, f in zip(self.stage_ranges[stage], self.stage_funcs[stage], strict=True):
            module = f.args[0] if isinstance(f, partial) else f
            params = module.parameters() if isinstance(module, nn.Module) else ()
            out.append((i, [p for p in params if p.requires_grad]))
        return out

    def stage_params(self, stage: int) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for _, params in self.stage_layer_params(stage):
            for p in params:
                seen.setdefault(id(p), p)
        return list(seen.values())

    def run_stage(self, stage: int, x, segmented: bool):
        """The stage's output, and with `segmented` the (input, output) of each layer, every layer
        run on a detached input so that the weight-gradient pass of one layer never walks the
        graph of the layers below it."""
        self.activate(stage)
        if not segmented:
            return super().forward(x), None
        if self.activation_checkpoint_interval > 0:  # checkpointed intervals run as one piece
            out = super().forward(x)
            return out, [(x, out)]
        segments: list[tuple] = []
        for layer in self.forward_funcs:
            x_in = as_leaf(x) if segments else x
            x = layer(x_in)
            segments.append((x_in, x))
        return x, segments

    def save_state_dict(self, *args, **kwargs):
        for s in self.local_stages:
            self.activate(s)
            with self._tied_uses_as_modules(), self._ep_writer():
                super().save_state_dict(*args, **kwargs)

    @contextmanager
    def _ep_writer(self):
        """With ep, the first ep data-parallel copies hold every expert between them (the other
        copies repeat them): each of those ranks writes its layers, as DeepSpeed has copy 0 do
        (`data_parallel_id == 0`), into files named with its ep rank (`ckpt_layer_path`)."""
        dp_id = self._grid.data_parallel_id
        if self.ep.size > 1 and dp_id < self.ep.size:
            self._grid.data_parallel_id = 0
        try:
            yield
        finally:
            self._grid.data_parallel_id = dp_id

    def ckpt_layer_path(self, ckpt_dir, local_layer_idx):
        return _ep_layer_file(super().ckpt_layer_path(ckpt_dir, local_layer_idx), self.ep)

    def ckpt_layer_path_list(self, ckpt_dir, local_layer_idx):
        if self.ep.size == 1:
            return super().ckpt_layer_path_list(ckpt_dir, local_layer_idx)
        idx = local_layer_idx + self._local_start
        # DeepSpeed's pattern (every tp rank's file of the layer) for this ep rank
        pattern = os.path.join(ckpt_dir, f"layer_{idx:02d}-*model_states.pt")
        return sorted(glob.glob(_ep_layer_file(pattern, self.ep)))

    @contextmanager
    def _tied_uses_as_modules(self):
        """The stage's layers with each tied use other than the first (a `partial` of its
        forward_fn, which DeepSpeed's save and load skip: no state_dict) as its module, so a
        tied module's rank of the LM head saves and loads the head's own parameters (its final
        norm) too, not only the tied weight DeepSpeed broadcasts from the first rank."""
        funcs = self.forward_funcs
        self.forward_funcs = [f.args[0] if isinstance(f, partial) else f for f in funcs]
        try:
            yield
        finally:
            self.forward_funcs = funcs

    def load_state_dir(self, *args, **kwargs):
        # The parent broadcasts tied weights after loading; ranks hold different numbers of
        # stages, so that collective must run once, after all of them.
        self._synchronize_tied_weights = lambda: None
        try:
            for s in self.local_stages:
                self.activate(s)
                with self._tied_uses_as_modules():
                    super().load_state_dir(*args, **kwargs)
        finally:
            del self._synchronize_tied_weights
        self._synchronize_tied_weights()


class FixedPartitionModule(PipelineModule):
    """DeepSpeed's PipelineModule, one stage per rank, with the stage boundaries `parts`
    (stage s runs layers parts[s] .. parts[s+1]-1)."""

    def __init__(self, layers, parts: list[int], **kwargs):
        self._fixed_parts = parts
        super().__init__(layers, **kwargs)

    def _partition_layers(self, method=None):
        self.parts = list(self._fixed_parts)
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])


def parameters_parts(layers, num_stages: int) -> list[int]:
    """Stage boundaries of DeepSpeed's `parameters` partitioning, as Python ints (DeepSpeed's
    own are numpy ints, which its `seed_layers` cannot seed with)."""
    counts = PipelineModule._count_layer_params(SimpleNamespace(_layer_specs=list(layers)))
    return [int(x) for x in ds_utils.partition_balanced(weights=counts, num_parts=num_stages)]


def _ep_layer_file(path: str, ep: EpGroup) -> str:
    """DeepSpeed's layer file name `layer_XX-...model_states.pt` with the ep rank after the
    layer, `layer_XX-ep_YY-...` (unchanged at ep 1)."""
    if ep.size == 1:
        return path
    folder, name = os.path.split(path)
    layer, rest = name.split("-", 1)
    return os.path.join(folder, f"{layer}-ep_{ep.rank:02d}-{rest}")


def layer_name(spec) -> str:
    """A layer spec's or module's class name."""
    typename = getattr(spec, "typename", None)
    return getattr(typename, "__name__", type(spec).__name__)
