"""Cross-model comparison of two stored runs (``compare_runs``; CLI ``reward-lens-spec compare``)."""
from .runs import CompareParams, compare_runs

__all__ = ["CompareParams", "compare_runs"]
