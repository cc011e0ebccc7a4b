"""Per-layer costs (time, memory, messages) and their aggregation into stage costs."""

from .table import CostTable, LayerCost, Link, StageCost, uniform_stage_costs

__all__ = ["CostTable", "LayerCost", "Link", "StageCost", "uniform_stage_costs"]
