"""octodsl: plan, check, simulate, tune and run pipeline-parallel training of hybrid LLMs."""

__version__ = "0.2.0"
