"""The scorecard record: one graded observable's readings, verdicts and scope, and how it prints.

``Scorecard`` is what ``trust.scorecard.grade`` fills (``trust.grading``) and ``write_card`` stores (sealed);
its verdict is always re-derived from these numbers (``trust.evidence.card_verdict``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .evidence import card_verdict


def _truth_summary(truth: dict) -> dict:
    """``truth`` for printing: a per-pair table or a long list as its size, other values as they are."""
    def short(v):
        if isinstance(v, dict) and (len(v) > 4 or any(isinstance(x, (list, dict)) for x in v.values())):
            return f"<{len(v)} pairs>"
        return f"<{len(v)} values>" if isinstance(v, (list, tuple)) and len(v) > 4 else v
    return {k: short(v) for k, v in truth.items()}


def finite_or_none(x):                 # store attrs must be JSON: NaN -> None
    return float(x) if np.isfinite(x) else None


@dataclass
class Scorecard:
    """One graded observable; ``readings[criterion]`` has one value per strength (None = not finite)."""

    observable: str
    spec_hash: str
    version: int
    model_family: str
    organism: str
    base: str
    strengths: list
    readings: dict = field(default_factory=dict)
    spearman: dict = field(default_factory=dict)
    floors: dict = field(default_factory=dict)
    criteria_passed: dict = field(default_factory=dict)
    passed: bool = False
    ungraded: list = field(default_factory=list)
    truth: dict = field(default_factory=dict)
    organism_checksum: str = ""
    organism_params: dict = field(default_factory=dict)
    organism_fingerprints: list = field(default_factory=list)     # model_fingerprint per strength
    magnitude: dict = field(default_factory=dict)    # criterion -> {reading, truth} reward units, full strength
    identities: list = field(default_factory=list)   # per strength: the run's identity records
    graded: list = field(default_factory=list)       # output variables some criterion read
    reading_errors: dict = field(default_factory=dict)   # criterion -> why its reading could not be taken
    cells: dict = field(default_factory=dict)        # criterion -> {fit, n}: its output's cells at full strength
                                                     # against trust.cell_truth's recomputation
    scope: dict = field(default_factory=dict)        # family, organism, base, strengths, n_pairs
    why_not: dict = field(default_factory=dict)      # ungraded output -> why no criterion grades it (trust.coverage)
    code_hash: str = ""                              # evidence.code_hash() of the code that graded it
    dtype: str = "float32"                           # the organisms' dtype: lifts runs in this dtype only
    wall_s: float = 0.0

    def describe(self) -> str:
        lines = [f"scorecard {self.observable} v{self.version} [{self.spec_hash[:12]}] on {self.organism} "
                 f"({self.base}, family {self.model_family}); truth {_truth_summary(self.truth)}"]
        lines.append(f"  {'criterion':<24}" + "".join(f"{'s=' + format(s, 'g'):>9}" for s in self.strengths)
                     + f"{'spearman':>10}  floor")
        for c, vals in self.readings.items():
            fl = self.floors[c]
            row = "".join(f"{v:9.3f}" if v is not None else f"{'nan':>9}" for v in vals)
            rho = self.spearman[c]
            lines.append(f"  {c:<24}{row}{'nan' if rho is None else round(rho, 3):>10}  "
                         f"{fl['value'] if fl['value'] is None else round(fl['value'], 3)} "
                         f"(needs {fl['what']}) -> {'pass' if self.criteria_passed[c] else 'FAIL'}")
            if c in self.reading_errors:
                lines.append(f"  {'':<24}could not read: {self.reading_errors[c]}")
        for c, m in self.magnitude.items():
            lines.append(f"  {c:<24}magnitude {m['reading']} vs planted {m['truth']} reward units")
        for c, m in self.cells.items():
            lines.append(f"  {c:<24}cells vs recomputation: fit {m['by_output']} (each needs ≥ 0.999)")
        worst: dict = {}
        def rel(r):            # None (could not compare) or a zero scale with an error: worst
            e, sc = r.get("max_abs_err"), r.get("scale")
            if e is None or sc is None:
                return np.inf
            return e / sc if sc else (0.0 if e == 0 else np.inf)
        for rec in (r for per in self.identities for r in per):        # the worst strength per identity
            k = rec["identity"]                                        # (scale 0: a zero margin, e.g. strength 0)
            if k not in worst or rel(rec) > rel(worst[k]):
                worst[k] = rec
        for k, rec in worst.items():
            e, sc = rec.get("max_abs_err"), rec.get("scale")
            lines.append(f"  identity {k}: max |err| {'none' if e is None else format(e, '.3g')} (margin scale "
                         f"{'none' if sc is None else format(sc, '.3g')})")
        for v in self.ungraded:
            lines.append(f"  not graded: {v}: {self.why_not.get(v, 'no planted truth to compare')}")
        why = card_verdict(asdict(self))[1]
        lines.append(f"  => {'PASS' if self.passed else 'FAIL'}" + (f" ({why})" if why else ""))
        return "\n".join(lines)
