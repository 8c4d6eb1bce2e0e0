"""Criteria readings into a scorecard: per strength, Spearman over strengths, the floor at full strength, the
planted magnitude and the cells against an independent recomputation (``trust.cell_truth``), then the verdict.

``grade_readings`` never raises on a reading: a criterion that cannot read its output records why in the
card's ``reading_errors`` and fails (module doc of ``trust.scorecard``).
"""
from __future__ import annotations

from dataclasses import asdict

import numpy as np
import xarray as xr

from ..stats import spearman_rho
from .card import Scorecard, finite_or_none
from .cell_truth.common import fit
from .evidence import card_verdict, code_hash


def grade_readings(card: Scorecard, crits, results, truths, refs=None, truth_effect=None, organisms=None,
                   obs=None) -> Scorecard:
    """Criteria ``crits`` on ``results`` (one Dataset per strength of ``card.strengths``, beside each strength's
    truth) into ``card``, then its verdict. Never raises on a reading: a criterion that cannot read its output
    (any error) records why in ``reading_errors`` and fails; non-finite readings are stored as None."""
    s = card.strengths
    zero = int(np.argmin(s)) if min(s) == 0 else None
    top = int(np.argmax(s))
    planted = "layer" in truths[0]
    refs = refs if refs is not None else [xr.Dataset() for _ in results]
    for c in crits:
        try:
            _grade_one(card, c, results, truths, refs, s, zero, top, planted, truth_effect, organisms, obs)
        except Exception as exc:       # noqa: BLE001  a reading that does not fit its criterion fails the card
            card.reading_errors[c.name] = f"{type(exc).__name__}: {exc}"
            card.readings[c.name] = [None] * len(s)
            card.spearman[c.name] = None
            card.floors[c.name] = {"value": None, "floor": c.floor, "what": c.floor_what, "at_strength": s[top]}
            card.magnitude.pop(c.name, None)
            card.cells.pop(c.name, None)
            card.criteria_passed[c.name] = False
    card.code_hash = code_hash()
    card.passed = card_verdict(asdict(card))[0]
    return card


def _grade_one(card: Scorecard, c, results, truths, refs, s, zero, top, planted, truth_effect,
               organisms=None, obs=None) -> None:
    """Criterion ``c``'s readings, Spearman, floor and magnitude into ``card`` (any error: the caller fails it)."""
    vals = [float(np.mean(c.reading(ds, t))) for ds, t in zip(results, truths)]
    rho = spearman_rho(s, vals)
    if planted and c.magnitude is not None:
        got = None if zero is None else float(np.mean(c.magnitude(results[top], truths[top])
                                                      - c.magnitude(results[zero], truths[zero])))
        want, source = truth_effect, "cells" if c.name == "score" else "margin"   # Δ: the margin's own cells
        if c.exact and zero is not None:    # exact instrument: the same cells, plain forward
            try:
                want = float(np.mean(c.magnitude(refs[top], truths[top])
                                     - c.magnitude(refs[zero], truths[zero])))
                source = "cells"
            except (KeyError, ValueError, IndexError):
                pass
        card.magnitude[c.name] = {"reading": finite_or_none(got) if got is not None else None,
                                  "truth": finite_or_none(want) if want is not None else None, "truth_from": source}
    fv = float(c.floor_value(results[top], truths[top]))
    card.readings[c.name] = [finite_or_none(v) for v in vals]
    card.spearman[c.name] = finite_or_none(rho)
    card.floors[c.name] = {"value": finite_or_none(fv), "floor": c.floor, "what": c.floor_what,
                           "at_strength": s[top]}
    if c.cells is not None:            # the output's cells against an independent recomputation
        if organisms is None:          # cells need the organism itself: a reading without one cannot show them
            raise ValueError("cells: no organism to recompute them from")
        by = {v: fit(*gw) for v, gw in c.cells(results[top], organisms[top], obs).items()}
        card.cells[c.name] = {"fit": finite_or_none(min(by.values())), "by_output": {v: finite_or_none(f) for v, f in by.items()}}
    one = {k: getattr(card, k) for k in ("truth", "spearman", "floors", "magnitude", "cells")}
    card.criteria_passed[c.name] = card_verdict({**one, "readings": {c.name: card.readings[c.name]}},
                                                check_code=False)[0]
