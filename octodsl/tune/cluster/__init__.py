"""`octodsl tune --gpus`: the whole configuration (tp x pp x dp, micro-batching, ZeRO) searched
around the pipeline tuner (docs/cluster.md).

- space.py: the configurations, their problems and why each left out is left out;
- target.py: the runtimes a configuration is for (octodsl's DeepSpeed executor, Megatron-LM);
- search.py: the search within one budget;
- baselines.py: the Megatron-style baselines it is measured against;
- report.py: its tables and JSON.
"""
