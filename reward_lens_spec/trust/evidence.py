"""A trust-bearing document's seal and a scorecard's verdict: what ``trust.evidence_chain`` derives trust from.

Every trust-bearing store document (result run, scorecard, frozen study, adjudication) is *sealed* when
written: ``content_hash`` = sha256 of the canonical JSON of its attrs, leaving out the store's own keys
(``STORE_KEYS``) and the cache keys (``CACHE_KEYS``: the stored ``trust`` label and per-variable labels);
``seal_error`` says why a seal does not verify. ``card_verdict`` recomputes a scorecard's verdict from its
stored readings with this package's thresholds (``MIN_SPEARMAN``, each criterion's floor and ``rtol``,
``CELL_FLOOR``, ``MAG_RTOL_EXACT``) and passes only a card whose ``code_hash`` equals ``code_hash()`` of the
reading code; ``identities_ok`` re-checks stored exactness identities against ``IDENTITY_RTOL``.
``LEVELS`` are the trust levels, lowest first. The derivation itself (which level a run gets from the
documents a store holds) is ``trust.evidence_chain``.

No torch import: the store reader calls this.
"""
from __future__ import annotations

import hashlib
import json

from .certificate import held_out_ok
from .code_identity import CODE_MODULES, code_changes, code_hash  # noqa: F401  (re-exported)
from .drift_criteria import UNDOSED
from ..registries import CRITERIA

CACHE_KEYS = ("trust", "trust_by_variable", "content_hash")
STORE_KEYS = ("run_id", "observables", "created", "complete", "store_write_s", "writer", "attempt")
DERIVED_KEYS = ("trust_stored", "trust_verified", "trust_reason", "trust_by_variable", "trust_scope")
NOT_RESULTS = ("scorecard", "study", "adjudication")

MIN_SPEARMAN = 0.9
# ρ over n strengths is a multiple of 6 / (n (n² − 1)) in exact arithmetic (one adjacent swap of 5: exactly 0.9),
# but scipy returns 0.8999999999999998 for it: the floor forgives float rounding only, never a rank
RHO_ROUNDING = 1e-9
# Each criterion's floor (its floor value must be ≥ it), magnitude band ``rtol`` (|reading − planted truth| ≤
# rtol · |planted truth|, reward units, at full strength) and exactness sit beside it (``trust.criteria``,
# ``registries.CRITERIA``). Exact instruments (DLA, exact patching, the lens, the margin) are compared with the
# same cells from a plain HF forward (magnitude "truth_from": "cells"): float error only. Attribution patching
# (first order) and a truth that is only the planted margin change keep the ``rtol`` band.
MAG_RTOL_EXACT = 1e-3
# criteria with ``cells`` also read their output cell by cell against an independent recomputation
# (trust.cell_truth): the card's ``cells[c]["fit"]`` = 1 − max |err| / RMS(truth) must be ≥ CELL_FLOOR
CELL_FLOOR = 0.999
# exactness identities: max |err| ≤ IDENTITY_RTOL[dtype] · margin scale (see trust.identities)
IDENTITY_RTOL = {"float64": 1e-3, "float32": 1e-3, "bfloat16": 5e-2, "float16": 2e-2}


def numerics_of(doc: dict) -> str:
    """The dtype a run computed in or a card's organisms were graded in (``dtype``; a card written before cards
    recorded it was graded in float32, the organisms' only dtype then)."""
    return str(doc.get("dtype") or "float32")



def content_hash(attrs: dict) -> str:
    """sha256 hex of the canonical JSON of ``attrs`` minus ``STORE_KEYS`` and ``CACHE_KEYS``; a document
    that carries its log sequence number ``seq`` (every document completed since the evidence log,
    ``store.log``) has its ``created`` under the seal as well."""
    skip = STORE_KEYS + CACHE_KEYS + DERIVED_KEYS
    if "seq" in attrs:
        skip = tuple(k for k in skip if k != "created")
    body = {k: v for k, v in attrs.items() if k not in skip}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
                          .encode()).hexdigest()


def seal(attrs: dict) -> dict:
    """``attrs`` with its ``content_hash`` added (call last, after every other key is set)."""
    return {**attrs, "content_hash": content_hash(attrs)}


def seal_error(attrs: dict) -> str | None:
    """None when the document's seal verifies, else what failed."""
    got = attrs.get("content_hash")
    if not got:
        return "no content hash (not sealed when written)"
    if got != content_hash(attrs):
        return "content hash mismatch: the document was edited after it was written"
    return None


def identities_ok(records) -> tuple[bool, str]:
    """Re-check stored identity residuals against this package's tolerances (a certificate: ``trust.certificate``)."""
    for r in records or ():
        if "target" in r and not held_out_ok(r)[0]:
            return False, held_out_ok(r)[1]
        if "target" in r:
            continue
        rtol = IDENTITY_RTOL.get(str(r.get("dtype")), IDENTITY_RTOL["float32"])
        err, scale = r.get("max_abs_err"), r.get("scale")
        if err is None or scale is None or not err <= rtol * scale:
            return False, (f"identity {r.get('identity')!r} broken: max |err| {err} > {rtol:g} × margin scale "
                           f"{scale}")
    return True, ""


def card_verdict(card: dict, *, check_code: bool = True) -> tuple[bool, str]:
    """``(passes, why not)`` recomputed from a card's stored numbers and this package's thresholds.

    ``check_code``: the card must record the ``code_hash`` of the code reading it (a card applies only
    to the operator and capture code that wrote it).
    """
    crits = list(card.get("readings") or {})
    if not crits:
        return False, "grades no criterion"
    if check_code:
        here = code_hash()
        if card.get("code_hash") != here:
            changed = code_changes()
            return False, (f"written by other code: card code hash {str(card.get('code_hash'))[:12]}, this code "
                           f"{here[:12]}" + (f" (replaced at run time: {', '.join(changed[:5])})" if changed else ""))
    dt = numerics_of(card)
    wrong = sorted({str(r.get("dtype")) for per in card.get("identities") or () for r in per or ()
                    if "dtype" in r and str(r.get("dtype")) not in (dt, "float64")})   # float64: our own recomputations
    if wrong:
        return False, f"the card says dtype {dt} but its identities were computed in {', '.join(wrong)}"
    planted = "layer" in (card.get("truth") or {})
    for c in crits:
        crit = CRITERIA.get(c, default=None)
        if crit is None:
            return False, f"unknown criterion {c!r}"
        if (card.get("reading_errors") or {}).get(c):
            return False, f"{c}: could not read the output: {card['reading_errors'][c]}"
        rho = (card.get("spearman") or {}).get(c)
        if c not in UNDOSED and (rho is None or not rho >= MIN_SPEARMAN - RHO_ROUNDING):   # drift: no strength axis
            return False, f"{c}: Spearman {rho} < {MIN_SPEARMAN}"
        fv = ((card.get("floors") or {}).get(c) or {}).get("value")
        if fv is None or not fv >= crit.floor:
            return False, f"{c}: floor value {fv} < {crit.floor}"
        if crit.cells is not None:                 # the output's cells against an independent recomputation
            fit = ((card.get("cells") or {}).get(c) or {}).get("fit")
            if fit is None or not fit >= CELL_FLOOR:
                return False, (f"{c}: output cells off the independent recomputation: fit {fit} < {CELL_FLOOR} "
                               "(1 − max |err| / RMS of the recomputed cells)")
        if planted and crit.rtol is not None:  # criteria with a planted reward-unit magnitude
            m = (card.get("magnitude") or {}).get(c) or {}
            got, want = m.get("reading"), m.get("truth")
            rtol = MAG_RTOL_EXACT if crit.exact and m.get("truth_from") == "cells" else crit.rtol
            if got is None or want is None or not abs(got - want) <= rtol * abs(want) or want == 0:
                return False, (f"{c}: magnitude {got} reward units vs planted {want} "
                               f"(needs within {rtol:.3g} relative, truth from {m.get('truth_from', 'margin')})")
    for per_strength in card.get("identities") or ():
        ok, why = identities_ok(per_strength)
        if not ok:
            return False, why
    return True, ""


def __getattr__(name: str):
    """``CELL_CRITERIA``: the names of the criteria with a ``cells`` recomputation, read from
    ``registries.CRITERIA`` (each criterion carries its own)."""
    if name != "CELL_CRITERIA":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return tuple(n for n in CRITERIA if CRITERIA[n].cells is not None)
