"""The pipeline simulator: a plan and its costs -> timelines of compute, communication, memory.

    program = compile(plan)                    # flat arrays from octodsl.dag.build_graph
    result = simulate(program, SimCosts.from_table(table, plan), link)   # or a StageCost list
    result.iteration_time, result.bubble_ratio, result.peak_memory, result.critical_path()

The model (after OctoPipe's simulator):
- A node per slot of the plan (an op, or an overlap group whose ops share one slot: each op's
  expert all-to-alls run under the others' compute, `SimProgram.per_slot`); data edges from
  octodsl.dag; each device runs its nodes in the plan's order on its compute stream.
- A data edge between devices is a message of the producing cut's `send_bytes` (activations
  forward, gradients of the same size backward), taking `link.time(bytes)` on the cut's link:
  the inter-node one when the two devices' ranks sit in different nodes (links.py, by the
  plan's tp x pp x dp mesh, octodsl.mesh), else the intra-node one. A device is a tp group
  whose ranks run in lockstep, and every dp copy runs alike: one pipeline is walked, whatever
  the world size; the tp collectives are inside the ops' costs. Each device has one
  communication stream beside its compute stream; a message holds the sender's and the
  receiver's stream for its whole transfer (the receive ends with the send), and streams take
  messages in the order they become ready, ties broken by the consumer's place in the plan's
  order (a program reused for a reordered plan times it as a fresh compile does). The walk is deterministic and never hangs: a plan that cannot run raises SimDeadlock
  with lint's wait-for cycle.
- Memory per device: static bytes of its stages (sharded by ZeRO), activations allocated when
  F starts (with recompute, what F keeps), what recompute brings back allocated when B starts,
  released down to act_w when B ends and the rest when W ends (all of it when a fused BW ends).
- DP > 1 (dpcomm.py): each device all-reduces its stages' gradients over a ring once its
  compute and messages are done; under ZeRO 1 a reduce-scatter there and an all-gather of the
  parameters after the optimizer step; under ZeRO 2 a reduce-scatter after each W, on a
  data-parallel stream, overlapping later compute (formulas, not simulated per rank), each
  device's on the link its dp group spans (links.py).
- Calibrated costs (octodsl.calibrate) may add: a fused BW's own cost (StageCost.bw); devices
  that share processors (SimCosts.sharing, sharing.py: walks repeated until every op's duration
  is consistent with how many devices compute beside it); an optimizer step per device
  (StageCost.update) once every device is done, and a fixed step overhead. Without them the
  walk is the one above.

Metrics (SimResult): iteration time; per device busy, idle (bubble), communication and the part
of it not under the device's own compute (exposed); bubble ratio = idle / iteration time;
overlap rate = communication under compute / all communication; each link's busy seconds
(`link_busy`: tp collectives, pipeline messages inside and between nodes, dp collectives);
peak memory and the op at the peak; a lower bound (bounds.py) and efficiency = bound /
iteration time; the critical path.

Modules: program (compile), core (the walk), memory, bounds, dpcomm (the data-parallel end of
the iteration), links (which link each transfer takes), costs (SimCosts), simulate, result; for people: report (summary, JSON), trace (Chrome / Perfetto), gantt (PNG). Lint's
memory rule (E501) is octodsl.lint.memory, on top of memory.py.

Speed: the walk is numba-compiled when numba is installed (jit.py): about 1 ms for 12k ops,
against about 40 ms to compile the plan (mostly the dependency graph); see
benchmarks/simulator.md. A plan whose every slot is one op, each op once (every plan the tuner
makes), compiles from arrays of its ops instead, in a few milliseconds. A plan whose device
orders changed but nothing else recompiles in about a millisecond with
`compile(plan, like=previous_program)`.
"""

from .costs import SimCosts
from .memory import Memory, memory
from .program import SimProgram, compile
from .result import MessageSpan, OpSpan, SimResult, Step
from .simulate import SimDeadlock, simulate, warm_up

__all__ = [
    "Memory",
    "MessageSpan",
    "OpSpan",
    "SimCosts",
    "SimDeadlock",
    "SimProgram",
    "SimResult",
    "Step",
    "compile",
    "memory",
    "simulate",
    "warm_up",
]
