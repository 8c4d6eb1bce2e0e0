"""A held-out certificate as a run's identity: the verdict re-derived from the stored interval (no torch, no
xarray: the store reader calls it through ``trust.evidence.identities_ok``).

A record (``trust.identities.held_out_record``) holds ``interval`` [lo, hi] — the fresh probe's held-out AUC
after LEACE erasure, its bootstrap CI (``ops.leace_certificate``) — and ``target`` 0.5 (chance). It holds only
when the interval, as stored, contains the target; its stored ``max_abs_err`` is not believed. Source:
Belrose et al. 2023 (LEACE), §6: erasure is tested by a fresh probe on held-out data.
"""
from __future__ import annotations

import math


def certificate_gap(interval, target: float) -> float:
    """Distance of ``target`` outside ``interval`` [lo, hi] (0 inside; inf when a bound is missing or not finite)."""
    lo, hi = (list(interval) + [None, None])[:2] if isinstance(interval, (list, tuple)) else (None, None)
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (lo, hi)):
        return float("inf")
    return float(max(0.0, lo - target, target - hi))


def held_out_ok(record: dict) -> tuple[bool, str]:
    """``(holds, why not)`` for one certificate record."""
    if certificate_gap(record.get("interval"), float(record["target"])) == 0.0:
        return True, ""
    return False, (f"{record.get('variable')}: {record.get('identity')!r} fails: interval {record.get('interval')} "
                   f"does not contain {record['target']} (the erasure does not hold on held-out pairs)")
