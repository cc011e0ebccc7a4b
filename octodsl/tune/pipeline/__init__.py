"""The pipeline tuner: partition, placement, schedule and recompute searched together for one
problem (octodsl.tune.problem), round by round.

- layout.py: a plan's partition and placement as two tuples;
- construct.py: each device's order by list scheduling (ZeroBubble-style priorities, memory
  aware);
- estimate.py: the closed-form bubble-aware bound the partition search ranks cuts with;
- moves/: partition, placement, schedule, recompute and memory moves, small functions over plans;
- diagnose.py, propose.py, loop.py: which phase a round works on, its candidate moves, the loop;
- evaluate.py: every plan is timed by octodsl.sim.
"""
