"""Trust levels, computed from what a run has — never typed into a config.

exploratory → calibrated → registered → adjudicated. Until calibration
scorecards and frozen studies exist in the store, every run is exploratory.
"""
from __future__ import annotations

LEVELS = ("exploratory", "calibrated", "registered", "adjudicated")


def compute_trust(run, store_url: str) -> str:
    """The trust level this run earns. Without a passing scorecard or a frozen study: exploratory."""
    return "exploratory"
