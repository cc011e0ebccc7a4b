"""OctoPipeEngine: DeepSpeed's PipelineEngine running any plan.

`train_batch()` and `eval_batch()` are DeepSpeed's own; what they execute is the plan compiled
for this rank (program.py) instead of TrainSchedule. The engine holds several stages per rank
(module.py), sends to any rank (p2p.py), splits backward into B and W where the plan does
(octodsl.layers.split_backward), recomputes activations per stage as the plan says, computes the
loss on whichever rank holds the last stage, and keeps DeepSpeed's optimizer, scheduler, bf16 /
ZeRO-1, gradient clipping, data parallelism, tied weights and checkpoints working.

Recompute (the plan's `recompute` section): a `full` stage's F runs without grad and keeps only
its input (and on the loss stage the labels); its B or BW first runs the forward again, with
grad, from that input, then backward as usual; the graph it builds lives until W, so W finds
what it needs. A `selective` stage's F runs inside `octodsl.layers.recompute.dropping()`: the
layers drop what selective recompute drops per layer kind, and the backward (B, or BW) brings
it back once and keeps it until W. Either way B and W run the same operations on the same
values as without recompute.

Per step, per rank: the instructions of each of the plan's slots (post receives ahead, wait for
inputs, compute, send), then wait for the sends, reduce tied and data-parallel gradients, and
step the optimizer.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from deepspeed import comm as dist
from deepspeed.runtime.base_optimizer import ZeROOptimizer
from deepspeed.runtime.pipe import schedule
from deepspeed.runtime.pipe.engine import PipelineEngine

from ..layers import expert_parallel
from ..layers.recompute import dropping
from ..layers.split_backward import (
    CannotSplit,
    WeightGradState,
    backward_input,
    backward_weight,
)
from ..plan import Op, OpKind, Plan, Recompute, Slot
from ..trace import COMPUTE, TimedSpan, op_span, write_trace
from . import memory, program
from .checkpoint import Checkpoints
from .lanes import Lane, in_turn_note, in_turn_reason
from .mesh import (
    expert_lane_group,
    expert_params,
    global_rank,
    grad_norm,
    reduce_sequence_parallel_grads,
    sequence_parallel_params,
)
from .module import OctoPipeModule, as_leaf
from .p2p import P2P, flat
from .watchdog import DEFAULT_TIMEOUT, Watchdog


@dataclass(slots=True)
class _Saved:
    """What a stage keeps of one micro-batch between its forward and its backward ops."""

    inputs: object
    root: object
    """The stage's output, or on the loss stage its scaled loss (None until B or BW recomputes
    it, on a stage that recomputes fully)."""
    segments: list | None = None
    """(input, output) per layer when the backward is split (the last output is `root`)."""
    weight: WeightGradState | None = None
    """After B: what W runs."""
    labels: object = None
    """On the loss stage of a stage that recomputes fully: the labels, for the loss again."""


class OctoPipeEngine(Checkpoints, PipelineEngine):
    total_loss: torch.Tensor | None  # PipelineEngine's: the losses of the step, summed

    def __init__(
        self, *args, plan: Plan, timeout: float = DEFAULT_TIMEOUT, trace: bool = False, **kwargs
    ):
        self._in_parent_init = True  # the parent's warm-up uses topological first/last stages
        super().__init__(*args, **kwargs)
        self._in_parent_init = False
        module = self.module
        assert isinstance(module, OctoPipeModule), "model must be an OctoPipeModule"
        assert not (self.is_pipe_partitioned or self.is_grad_partitioned), (
            "OctoPipeEngine does not support pipe_partitioned or grad_partitioned"
        )
        self.plan = plan
        self.loss_stage = plan.num_stages - 1
        self.loss_device = module.stage_device[self.loss_stage]
        self.local_stages = module.local_stages
        self._stage_params = {s: module.stage_params(s) for s in self.local_stages}
        self._shared = self._params_of_several_stages()
        self._use_grads: dict[tuple[int, int], torch.Tensor | None] = {}
        self._split = plan.split_stages()
        self._recompute = plan.recompute()
        self._probed: set[int] = set()
        self._fused_in_b: set[int] = set()
        self.tp, self.ep = module.tp, module.ep
        self._ep_peers = (
            "a rank of its ep group (ranks "
            + ", ".join(map(str, torch.distributed.get_process_group_ranks(self.ep.group)))
            + ")"
            if self.ep.size > 1
            else ""
        )
        self._sequence_parallel = sequence_parallel_params(module.parameters())
        self._train_sched = program.PlanSchedule(
            plan, self.stage_id, train=True, at_once=self._at_once
        )
        self._eval_sched: program.PlanSchedule | None = None
        dp_id, tp_id = self.grid.data_parallel_id, self.tp.rank
        one_per_device = self.grid.data_parallel_size == 1 and self.tp.size == 1
        self._trace_pid = (self.stage_id if one_per_device else self.global_rank) if trace else None
        self.watchdog = Watchdog(
            timeout,
            f"rank {self.global_rank} (device {self.stage_id}, "
            f"data-parallel copy {dp_id}" + (f", tp rank {tp_id})" if self.tp.size > 1 else ")"),
        )
        self.p2p = P2P(
            self.stage_id,
            lambda d: global_rank(self.grid, d, dp_id, tp_id),
            self._stream_groups(),
            self.device,
            self.watchdog,
            self._trace_pid,
        )
        self._lane = self._second_lane()
        self._op_spans: list[TimedSpan] = []
        # a traced run also meters memory in its first step and times each optimizer update
        self._meter = memory.MemoryMeter(self) if trace else None
        if trace:
            self._time_updates()
        self._reset_buffers()
        if self.training_data:  # the parent gave the loader to the topological end ranks
            self._build_data_iter(self.training_data)

    def _stream_groups(self) -> dict[tuple[int, int], dist.ProcessGroup]:
        """A two-rank group per direction between devices that exchange messages, in each
        data-parallel copy and for each tp rank: tp rank t of a device talks to tp rank t of the
        other (every rank creates every group, in the same order)."""
        pairs = sorted({(m.src, m.dst) for m in self._train_sched.messages})
        mine = {}
        for dp in range(self.grid.data_parallel_size):
            for tp in range(self.tp.size):
                for a, b in pairs:
                    group = dist.new_group(
                        ranks=[global_rank(self.grid, d, dp, tp) for d in (a, b)]
                    )
                    if (dp, tp) == (self.grid.data_parallel_id, self.tp.rank):
                        mine[(a, b)] = group
        return mine

    def _at_once(self, ops: tuple[Op, ...]) -> bool:
        """Whether the overlap group `ops` runs its ops at once (lanes.py says when)."""
        return in_turn_reason(ops, self._recompute, self.ep.size, self.tp.size) is None

    def _second_lane(self) -> Lane | None:
        """The lane a group's forward runs on, when some group of the plan runs at once (on any
        device: every rank creates the lane's ep groups, in the same order). With ep > 1, the
        first group of this device that runs in turn is named, with the reason."""
        groups = [slot.ops for slots in self.plan.schedule for slot in slots if slot.overlapped]
        mine = [slot.ops for slot in self.plan.schedule[self.stage_id] if slot.overlapped]
        note = in_turn_note(self.stage_id, mine, self._recompute, self.ep.size, self.tp.size)
        if note and self.grid.data_parallel_id == 0 and self.tp.rank == 0:
            print(note, file=sys.stderr, flush=True)
        if not any(self._at_once(ops) for ops in groups):
            return None
        return Lane(expert_lane_group(self.grid, self.ep.size), self.device, self.local_stages)

    def _reset_buffers(self) -> None:
        self._inputs: dict[int, object] = {}
        self._labels: dict[int, object] = {}
        self._inbox: dict[tuple[int, int], object] = {}
        self._grads: dict[tuple[int, int], list] = {}
        self._outbox: dict[tuple, object] = {}
        self._saved: dict[tuple[int, int], _Saved] = {}

    # Which ranks play DeepSpeed's first / last stage roles (data loading, the loss).
    def is_first_stage(self):
        if getattr(self, "_in_parent_init", True):
            return super().is_first_stage()
        return 0 in self.local_stages

    def is_last_stage(self):
        if getattr(self, "_in_parent_init", True):
            return super().is_last_stage()
        return self.loss_stage in self.local_stages

    def _loss_stage_global_rank(self):
        return self.grid.stage_to_global(self.loss_device)

    def _train_schedule(self):
        return self._train_sched

    def train_batch(self, data_iter=None):
        # The plan's own messages report a lost peer precisely (p2p.py); this catches it in
        # DeepSpeed's collectives (tied and data-parallel gradients, the loss broadcast).
        with self.watchdog.watching("another rank", "the step's collectives (gradients, loss)"):
            return super().train_batch(data_iter)

    def eval_batch(self, data_iter, *args, **kwargs):
        with self.watchdog.watching("another rank", "the evaluation's collectives (loss)"):
            return super().eval_batch(data_iter, *args, **kwargs)

    def _inference_schedule(self, micro_batches):
        if micro_batches != self.plan.microbatches:
            raise ValueError(
                f"the plan runs {self.plan.microbatches} micro-batches, not {micro_batches}"
            )
        if self._eval_sched is None:
            self._eval_sched = program.PlanSchedule(self.plan, self.stage_id, train=False)
        return self._eval_sched

    def reset_activation_shape(self):
        """Call on every rank when the shapes between stages change."""
        super().reset_activation_shape()
        self.p2p.reset_shapes()

    def _exec_schedule(self, pipe_schedule):
        self._reset_buffers()
        self.p2p.begin(pipe_schedule.messages)
        self.tput_timer.start()
        super()._exec_schedule(pipe_schedule)
        self._reset_buffers()

    # Instructions.
    def _exec_load(self, mb: int):
        batch = self._next_batch()
        if 0 in self.local_stages:
            x = batch[0]
            self._inputs[mb] = (
                x.clone().detach().to(self.device)
                if torch.is_tensor(x)
                else tuple(t.clone().detach().to(self.device) for t in x)
            )
        if self.loss_stage in self.local_stages:
            y = batch[1]
            self._labels[mb] = (
                y.to(self.device) if torch.is_tensor(y) else tuple(t.to(self.device) for t in y)
            )

    def _exec_post(self, ids):
        self.p2p.post(ids)

    def _exec_recv(self, msg: program.Message):
        value = self.p2p.recv(msg)
        if msg.act:
            self._inbox[(msg.consumer.stage, msg.mb)] = value
        else:
            self._grads[(msg.consumer.stage, msg.mb)] = value

    def _exec_send(self, msg: program.Message):
        self.p2p.send(msg, self._outbox.pop(msg.producer.key()))

    def _exec_finish_sends(self):
        self.p2p.finish()

    def _active_meter(self) -> memory.MemoryMeter | None:
        """The memory meter while it meters (a traced run's first step), else None."""
        return self._meter if self._meter is not None and self._meter.active else None

    def _exec_run(self, op: Op):
        self._run(op, self._watched_all_to_alls(op))
        self._ran()

    def _exec_run_group(self, ops: tuple[Op, ...]):
        """An overlap group at once: its forward on the second lane, its backward here
        (lanes.py); both ops' spans are traced, overlapping in time."""
        fwd, bwd = sorted(ops, key=lambda op: op.kind is not OpKind.F)
        assert self._lane is not None, "a group runs at once only where the lane exists"
        s, m = fwd.stage, fwd.mb
        x = self._inputs.get(m) if s == 0 else self._inbox.get((s, m))
        labels = self._labels.get(m) if s == self.loss_stage else None
        inputs = flat(x) + (flat(labels) if labels is not None else [])
        group = str(Slot(ops))
        self._lane.run(
            s,
            inputs,
            lambda: self._run(fwd, _nothing()),
            lambda: self._run(bwd, self._watched_all_to_alls(bwd, group)),
            self._all_to_all_wait(fwd, group),
        )
        if s != self.loss_stage:  # what the forward handed on (`_deliver`)
            out = self._outbox.get(fwd.key(), self._inbox.get((s + 1, m)))
            self._lane.handed_out(flat(out) if out is not None else [])
        self._ran()

    def _run(self, op: Op, all_to_alls) -> None:
        """Compute `op` inside `all_to_alls` (how its expert all-to-alls are waited for), metered
        and traced."""
        meter = self._active_meter()
        start = time.time()
        with (
            torch.autograd.graph.saved_tensors_hooks(meter.pack, _same) if meter else _nothing(),
            all_to_alls,
        ):
            {
                OpKind.F: self._forward,
                OpKind.B: self._backward_input,
                OpKind.W: self._backward_weight,
                OpKind.BW: self._backward,
            }[op.kind](op)
        if self._trace_pid is not None:
            self._op_spans.append(
                op_span(self._trace_pid, op.kind.value, op.stage, op.mb, start, time.time())
            )
        self.watchdog.last_done = str(op)

    def _ran(self) -> None:
        """After an op or a group: the memory sample, the messages' spans."""
        meter = self._active_meter()
        if meter is not None:
            meter.sample()
        if self._trace_pid is not None:
            self.p2p.poll()

    def _watched_all_to_alls(self, op: Op, group: str = ""):
        """With ep, the op's expert all-to-alls wait through the watchdog: one that outlasts the
        timeout, or whose peer died, stops the job naming the op (and its overlap group) and the
        ep group."""
        if self.ep.size == 1:
            return _nothing()
        return expert_parallel.waiting(self._all_to_all_wait(op, group))

    def _all_to_all_wait(self, op: Op, group: str) -> expert_parallel.Wait:
        what = f"an expert all-to-all of {op}" + (f" in the overlap group {group}" if group else "")
        peer = self._ep_peers
        return lambda work: self.watchdog.wait(work, what, peer)

    # Compute.
    def _forward(self, op: Op):
        s, m = op.stage, op.mb
        x = self._inputs.pop(m) if s == 0 else self._inbox.pop((s, m))
        labels = self._labels.pop(m) if s == self.loss_stage else None
        training = torch.is_grad_enabled()
        mode = self._recompute[s] if training else Recompute.NONE
        full = mode is Recompute.FULL
        with torch.no_grad() if full else dropping() if mode is Recompute.SELECTIVE else _nothing():
            out, loss, segments = self._run_stage(
                s, x, labels, training and self._split[s] and not full
            )
        if s == self.loss_stage:
            if self.eval_return_logits:
                self.outputs = out
            self.fwd_outputs.append(loss.detach())
            if self.total_loss is None:
                self.total_loss = torch.zeros_like(loss)
            self.total_loss += loss.detach()
        if training:
            saved = self._saved[(s, m)] = _Saved(x, None, labels=labels if full else None)
            if not full:
                saved.root, saved.segments = self._root(s, loss, segments)
        if s != self.loss_stage:
            self._deliver(op, out)

    def _run_stage(self, s: int, x, labels, segmented: bool) -> tuple[Any, Any, list | None]:
        """The stage's output, what its backward starts from before scaling (the loss on the
        loss stage, else the output), and with `segmented` each layer's (input, output)."""
        out, segments = self.module.run_stage(s, x, segmented=segmented)
        if s != self.loss_stage:
            return out, out, segments
        loss = (
            self.module.loss_fn(out, labels) if self._compute_loss and self.module.loss_fn else out
        )
        return out, loss, segments

    def _root(self, s: int, value, segments: list | None) -> tuple[object, list | None]:
        """`_Saved.root` and `.segments` from what `_run_stage` returned: on the loss stage, the
        scaled loss, which then ends the last layer's segment too."""
        if s != self.loss_stage:
            return value, segments
        root = self._scaled(value)
        if segments:
            segments[-1] = (segments[-1][0], root)
        return root, segments

    def _recomputed(self, op: Op, saved: _Saved) -> None:
        """Before the backward of a stage that recomputes fully: its forward again, with grad,
        from the input F kept (the same operations on the same values as F ran)."""
        if saved.root is None:
            segmented = op.kind is OpKind.B
            _, value, segments = self._run_stage(op.stage, saved.inputs, saved.labels, segmented)
            saved.root, saved.segments = self._root(op.stage, value, segments)
            saved.labels = None

    def _scaled(self, loss):
        """The loss as DeepSpeedEngine.backward differentiates it: averaged over the
        micro-batches (whichever rank computes it) and loss-scaled where the optimizer says."""
        loss = loss / self.gradient_accumulation_steps()
        return (
            self.optimizer.scale_if_loss(loss)
            if isinstance(self.optimizer, ZeROOptimizer)
            else loss
        )

    def _backward(self, op: Op):
        """BW: the fused backward of one stage and micro-batch."""
        s, m = op.stage, op.mb
        saved = self._saved.pop((s, m))
        self._recomputed(op, saved)
        roots, grads = self._roots(s, m, saved.root)
        with self._weight_grads(s):
            torch.autograd.backward(roots, grads)
        if s > 0:
            ins = flat(saved.inputs)
            self._deliver(op, _input_grads(ins, [t.grad for t in ins]))

    def _backward_input(self, op: Op):
        """B: input gradients now, layer by layer down the stage; weight gradients kept for W."""
        s, m = op.stage, op.mb
        saved = self._saved[(s, m)]
        self._recomputed(op, saved)
        probe = s not in self._probed  # the first B of a stage checks that weights wait for W
        fired: list[torch.nn.Parameter] = []
        hooks = (
            [p.register_post_accumulate_grad_hook(fired.append) for p in self._stage_params[s]]
            if probe
            else []
        )
        states = []
        segments = saved.segments
        assert segments is not None, "a split stage's forward keeps its layers' inputs and outputs"
        with self._weight_grads(s) if probe or s in self._fused_in_b else _nothing():
            outs, grads = self._roots(s, m, saved.root)
            for k in reversed(range(len(segments))):
                ins, layer_out = segments[k]
                if k < len(segments) - 1:  # below the top layer: what the layer above sent
                    keep = [
                        (t, g)
                        for t, g in zip(flat(layer_out), grads, strict=True)
                        if g is not None and t.requires_grad
                    ]
                    outs, grads = [t for t, _ in keep], [g for _, g in keep]
                try:
                    grads, state = backward_input(outs, grads, flat(ins))
                    states.append(state)
                except CannotSplit:  # this layer runs its whole backward now (the probe says so)
                    torch.autograd.backward(outs, grads)
                    grads = [t.grad for t in flat(ins)]
        for h in hooks:
            h.remove()
        if probe:
            self._probed.add(s)
            if fired:
                self._fused_in_b.add(s)
                self._warn_unsplit(s, fired)
        saved.weight = WeightGradState.merge(states)
        saved.segments = saved.root = None
        if s > 0:
            self._deliver(op, _input_grads(flat(saved.inputs), grads))

    def _backward_weight(self, op: Op):
        """W: the weight gradients B left, where the plan puts them."""
        saved = self._saved.pop((op.stage, op.mb))
        assert saved.weight is not None, "W runs after its B"
        with self._weight_grads(op.stage):
            backward_weight(saved.weight, self._stage_params[op.stage])

    def _roots(self, s: int, m: int, root) -> tuple[list, list]:
        """What the stage's backward starts from: the scaled loss, or the float outputs that
        require grad with the gradients received for them."""
        if s == self.loss_stage:
            return [root], [torch.ones_like(root)]
        outs = [t for t in flat(root) if t.is_floating_point()]
        grads = self._grads.pop((s, m))
        keep = [(o, g) for o, g in zip(outs, grads, strict=True) if o.requires_grad]
        return [o for o, _ in keep], [g for _, g in keep]

    def _deliver(self, op: Op, value):
        """Hand an op's result (F: the stage output; B/BW: the input gradients) to the stage
        that needs it on this rank, or leave it for the Send that follows the op."""
        s = op.stage + 1 if op.kind is OpKind.F else op.stage - 1
        if self.module.stage_device[s] != self.stage_id:
            self._outbox[op.key()] = value
        elif op.kind is OpKind.F:
            self._inbox[(s, op.mb)] = as_leaf(value)
        else:
            self._grads[(s, op.mb)] = value

    @contextmanager
    def _weight_grads(self, stage: int):
        """Around every backward of `stage` that accumulates weight gradients (W, BW): what
        DeepSpeed's own backward does for the optimizer (bf16: fresh low-precision grads, then
        added to the fp32 ones), with a parameter that another local stage also trains
        accumulating into this stage's own gradient (see `_params_of_several_stages`)."""
        bf16 = self.using_bf16_optimizer
        if bf16:
            self.optimizer.clear_lp_grads()
        shared = self._shared.get(stage, ())
        held = [p.grad for p in shared]
        for p in shared:
            p.grad = self._use_grads.pop((stage, id(p)), None)
        self._running_engine_backward = True
        try:
            yield
        finally:
            self._running_engine_backward = False
            for p, grad in zip(shared, held, strict=True):
                self._use_grads[(stage, id(p))] = p.grad
                p.grad = grad
        if bf16 and not self._config.bfloat16_config.immediate_grad_update:
            self.optimizer.update_hp_grads(clear_lp_grads=False)

    def _params_of_several_stages(self) -> dict[int, list[torch.nn.Parameter]]:
        """Per local stage, the parameters another local stage also trains: a tied module (the
        embedding and the LM head) with both uses on this rank. Stock DeepSpeed sums each use's
        micro-batches on its own rank and adds the two sums in the tied all-reduce; one `.grad`
        taking both uses in schedule order would round differently (4.8e-7 on the loss after
        three steps). So each use keeps its own sum and `_exec_reduce_tied_grads` adds them.
        bf16 accumulates in the optimizer's fp32 copies instead, and keeps schedule order."""
        if self.using_bf16_optimizer:
            return {}
        users: dict[int, list[int]] = {}
        params: dict[int, torch.nn.Parameter] = {}
        for s in self.local_stages:
            for p in self._stage_params[s]:
                users.setdefault(id(p), []).append(s)
                params[id(p)] = p
        shared: dict[int, list[torch.nn.Parameter]] = {}
        for key, stages in users.items():
            for s in stages if len(stages) > 1 else ():
                shared.setdefault(s, []).append(params[key])
        return shared

    def _exec_reduce_tied_grads(self):
        # Each use's sum joins the gradient in stage order, as stock's all-reduce adds the ranks'
        # (with two uses the order does not matter: a + b == b + a).
        for s in sorted(self._shared):
            for p in self._shared[s]:
                grad = self._use_grads.pop((s, id(p)), None)
                if grad is None:
                    continue
                if p.grad is None:
                    p.grad = grad
                else:
                    p.grad.add_(grad)
        super()._exec_reduce_tied_grads()

    def _exec_reduce_grads(self):
        # the norms' gradients under sp are partial sums over the tp group (each rank's slice)
        reduce_sequence_parallel_grads(self._sequence_parallel, self.tp, self.using_bf16_optimizer)
        # DeepSpeed's reduction (buffered_allreduce_fallback) all-reduces a routed expert's
        # gradient (`allreduce = False`) over the expert-data-parallel group its `group_name`
        # names, divided by the whole dp size as the dense ones are (each copy's loss is a mean
        # over dp), but only once it has found its own MoE layers (`has_moe_layers`), a flag it
        # also reads for checkpoint files and optimizer groups: so it is set for this alone.
        self.has_moe_layers = bool(expert_params(self.module.parameters()))
        try:
            super()._exec_reduce_grads()
        finally:
            self.has_moe_layers = False

    def clip_fp32_gradients(self):
        if self.tp.size == 1 and self.ep.size == 1:  # stock's clipping, unchanged (see mesh.py)
            return super().clip_fp32_gradients()
        params = [p for p in self.module.parameters() if p.grad is not None]
        norm = grad_norm(params, self.grid, self.tp, self._tied_copies(), self.device, self.ep)
        coef = torch.clamp(self.gradient_clipping() / (norm + 1e-6), max=1.0)
        for p in params:
            p.grad.detach().mul_(coef.to(p.grad.dtype))
        return norm

    def _tied_copies(self) -> set[int]:
        """Ids of the tied weights held here that another rank holds first (counted there)."""
        module = self.module
        return {
            id(module._recursive_getattr(module.tied_modules[key], attr))
            for key, comm in module.tied_comms.items()
            if comm["ranks"][0] != self.global_rank
            for attr in comm["weight_attr"]
        }

    def _warn_unsplit(self, s: int, fired) -> None:
        fired_ids = {id(p) for p in fired}
        layers = [
            i for i, ps in self.module.stage_layer_params(s) if any(id(p) in fired_ids for p in ps)
        ]
        if self.grid.data_parallel_id == 0 and self.tp.rank == 0:
            print(
                f"octodsl: stage {s}: layer(s) {', '.join(map(str, layers))} cannot split their "
                "backward (e.g. reentrant activation checkpointing): they run a fused backward "
                "in B; the stage's other layers still leave their weight gradients to W",
                file=sys.stderr,
                flush=True,
            )

    def _exec_optimizer_step(self, lr_kwargs=None):
        meter = self._active_meter()
        if meter is not None:
            meter.before_optimizer()
        super()._exec_optimizer_step(lr_kwargs)
        if meter is not None:
            meter.after_optimizer()

    # Traces.
    def _time_updates(self) -> None:
        """An "optimizer" span per step around `optimizer.step()` (the update alone, without
        the gradient-norm all-reduce before it)."""
        update, pid = self.optimizer.step, self._trace_pid
        assert pid is not None, "only a traced run times its updates"

        def timed_update(*args, **kwargs):
            start = time.time()
            out = update(*args, **kwargs)
            self._op_spans.append(
                TimedSpan(pid, COMPUTE, "optimizer", start, time.time(), {"kind": "optimizer"})
            )
            return out

        self.optimizer.step = timed_update

    def trace_spans(self) -> list[TimedSpan]:
        return self._op_spans + self.p2p.spans

    def write_trace(self, path: str, info: dict | None = None) -> dict[int, dict] | None:
        """Gather every rank's spans and memory; rank 0 writes the Chrome trace, with the
        layers of each stage, the memory counters and `info` in its otherData, and returns each
        rank's memory summary (memory.summary; None on the other ranks). Collective."""
        mine = (self.trace_spans(), self._meter.report() if self._meter is not None else None)
        gathered: list = [None] * dist.get_world_size()  # all_gather_object: each rank's
        torch.distributed.all_gather_object(gathered, mine)
        if self.global_rank != 0:
            return None
        names, pids = {}, []
        dp, tp = self.grid.data_parallel_size, self.tp.size
        for rank in range(dist.get_world_size()):
            coord = self.grid._topo.get_coord(rank)
            pid = coord.pipe if dp == 1 and tp == 1 else rank
            pids.append(pid)
            where = ([f"dp {coord.data}"] if dp > 1 else []) + (
                [f"tp {coord.model}"] if tp > 1 else []
            )
            names[pid] = f"device {coord.pipe}" + (f" ({', '.join(where)})" if where else "")
        reports = {
            pid: report
            for pid, (_, report) in zip(pids, gathered, strict=True)
            if report is not None
        }
        summaries = {pid: memory.summary(r) for pid, r in reports.items()}
        write_trace(
            path,
            [s for rank_spans, _ in gathered for s in rank_spans],
            names,
            lambda t0: [e for pid, r in reports.items() for e in memory.counter_events(pid, r, t0)],
            {
                "partition": [[r.start, r.stop - 1] for r in self.module.stage_ranges],
                "memory_method": memory.METHOD,
                "memory": {str(k): v for k, v in summaries.items()},
                **(info or {}),
            },
        )
        return summaries

    _INSTRUCTION_MAP = {
        **PipelineEngine._INSTRUCTION_MAP,
        program.LoadMicroBatch: _exec_load,
        program.PostRecvs: _exec_post,
        program.Recv: _exec_recv,
        program.Send: _exec_send,
        program.RunOp: _exec_run,
        program.RunGroup: _exec_run_group,
        program.FinishSends: _exec_finish_sends,
        schedule.ReduceTiedGrads: _exec_reduce_tied_grads,
        schedule.ReduceGrads: _exec_reduce_grads,
        schedule.OptimizerStep: _exec_optimizer_step,
    }


def _input_grads(inputs, grads) -> list:
    """The gradients of a stage's float inputs, zeros where none flowed (the receiver expects
    one tensor per float activation)."""
    return [
        torch.zeros_like(t) if g is None else g
        for t, g in zip(inputs, grads, strict=True)
        if t.is_floating_point()
    ]


@contextmanager
def _nothing():
    yield


def _same(t):
    return t
