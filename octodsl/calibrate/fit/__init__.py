"""Fit what a per-layer profile cannot see from measured runs of plans (their traces).

Inputs: the profile's cost table (uncalibrated), and runs: (plan, measured trace) pairs,
optionally with the link probe of the calibration launch (worker.py). Each parameter is fitted
from the observations that isolate it (observations.py reads them off the traces), in this
order (calibration.fit):

1. Processor sharing and per-op costs (compute.py). Each measured op is an interval on its
   device's compute thread; during it, k(t) devices compute at once (read off the same step of
   the trace). Under the simulator's sharing model (octodsl/sim/sharing.py) the work the op did
   is A = integral of rate(k(t)) dt, and the model says A = scale[kind] * base + overhead[kind],
   base being the profiled seconds of the op's layers (F: f, B: b, W: w, fused BW: b + w).
   Since A is linear in the time spent at each k, every (cores, contention) on a grid costs one
   matrix product and a small least-squares fit per kind (relative residuals, Huber weights so
   that ops slowed by other load count less); the grid point with the least loss wins.
2. Dispatch (link.py): the gap between consecutive ops of a device when the second one's inputs
   had arrived before the first ended (the executor's instructions between ops) is added to
   every op's overhead (its work at the rate the device had meanwhile).
3. Link (link.py): bandwidth from the probe's send/recv round trips (least squares over the
   sizes); latency from the hand-offs the trace shows: a consumer that waited for its message
   starts after producer end + latency + bytes / bandwidth + dispatch. Without a probe the
   bandwidth is the built-in loopback link's.
4. Overlap slowdown (compute.py): fitted with 1 when the messages in flight overlap enough
   compute (the fraction of op time under a transfer) to tell; otherwise left at 0 and said so.
5. Optimizer step (step.py): the optimizer spans of calibration runs, as work shared between
   the devices updating at once, per parameter of the device (through the origin).
6. Step overhead (step.py): the time from a step's last op to the next step's first op, less
   the optimizer's update (median over the timed steps).
7. Memory (memory.py): per layer kind, the bytes a split backward's weight-gradient state holds
   after B beyond what the profile's act_w says (the gradients at the weight-side restart
   points), from the measured memory just before and after each B (runs whose trace has
   memory).
8. Oversubscription (compute.py, then iteration.py): step 1 also fits the slowdown per process
   computing beyond the cores (alternating with the grid). But time-slicing makes single ops
   erratic (on 4 processes and 2 cores the same op takes 0.7x to 1.7x what fair sharing
   predicts), so the robust per-op fit does not see what it costs on average; it is settled
   late, as the value whose simulated iteration times match the runs best (least squares of
   the relative errors).
9. Timeline (iteration.py): one factor on every op's cost whose simulated iteration times match
   the runs best (then the oversubscription again): the simulator's timeline runs tighter than
   a real one, so the op-fitted costs alone simulated the runs 2-3% short on average.

report.py keeps what the steps saw (the profile's calibration.fit).
"""

from .calibration import fit
from .link import fit_link
from .memory import fit_memory
from .observations import Run, stage_bases
from .report import FitReport

__all__ = ["FitReport", "Run", "fit", "fit_link", "fit_memory", "stage_bases"]
