"""What the pipeline tuner is measured against, and how the comparison is shown.

- baselines.py: the classic schedules (1F1B, interleaved, ZB-H1/H2, ZB-V, DualPipeV) with the
  tuner's levers;
- random_search.py: random layouts and orders for the same number of evaluations;
- cpsat.py: the exact CP-SAT model of partition, placement and order (small problems);
- compare.py: the baselines, the tuner and the others within one budget (`octodsl tune`);
- report.py: its comparison table, the rounds explained and the JSON.
"""
