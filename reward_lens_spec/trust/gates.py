"""Trust levels, computed from what a run has — never typed into a config.

Levels form a ladder; a run gets the highest level whose gate passes together
with every gate below it:

exploratory   the default.
calibrated    the store holds a passing scorecard (``trust.scorecard``) for this
              observable's canonical spec hash, graded on organisms of the SAME
              model family as the run's model (``llama`` cards say nothing about
              ``gpt2``). Per (organism kind, base model) the latest card counts;
              every one of them must pass — a failing card is never outweighed,
              a card for another hash or family is ignored.
registered    calibrated, and the run executes a study (``run.experiment``) whose
              hash is frozen in the store (``trust.studies.check_run``). A study
              edited after freezing raises ``SpecError`` instead.
adjudicated   never earned by a run: it is the trust of the adjudication record
              written when a study's results are scored (``studies.adjudicate``).

``spec.validate`` refuses a ``trust`` key anywhere in a config.
"""
from __future__ import annotations

LEVELS = ("exploratory", "calibrated", "registered", "adjudicated")


def _family_of(run) -> str | None:
    from ..models.describe import describe_model
    try:
        return describe_model(run.model)[0].name
    except Exception:           # unreadable model config: no family, so no calibration claim
        return None


def calibration(run, store_url: str, *, model_family: str | None = None) -> dict:
    """``{"ok", "reason", "cards"}`` for the calibration gate (see module doc)."""
    from .scorecard import find_cards, observable_hash

    family = model_family or _family_of(run)
    h = observable_hash(run.observable)
    so = dict(getattr(run.store, "storage_options", {}) or {})
    cards = [c for c in find_cards(store_url, spec_hash=h, storage_options=so)
             if c.get("model_family") == family and family is not None]
    latest: dict = {}
    for c in cards:                                   # oldest first: later cards replace earlier ones
        latest[(c.get("organism"), c.get("base"))] = c
    ids = [c["run_id"] for c in latest.values()]
    if not latest:
        return {"ok": False, "reason": f"no scorecard for observable '{run.observable.name}' "
                f"[{h[:12]}] on family '{family}'", "cards": []}
    failed = [c["run_id"] for c in latest.values() if c.get("passed") is not True]
    if failed:
        return {"ok": False, "reason": f"failing scorecard(s) {failed}", "cards": ids}
    return {"ok": True, "reason": f"passing scorecard(s) {ids}", "cards": ids}


def registration(run, store_url: str) -> dict:
    """``{"ok", "reason", "study_id"}``; raises ``SpecError`` for a study edited after freezing."""
    from .studies import check_run

    if not run.experiment:
        return {"ok": False, "reason": "the run executes no study", "study_id": None}
    rec = check_run(run, store_url, storage_options=dict(getattr(run.store, "storage_options", {}) or {}))
    if rec is None:
        return {"ok": False, "reason": "its study is not frozen in the store", "study_id": None}
    return {"ok": True, "reason": f"executes frozen study {rec['study_id']}", "study_id": rec["study_id"]}


def trust_report(run, store_url: str, *, model_family: str | None = None) -> dict:
    """Every gate's verdict and the resulting level: ``{"level", "calibrated", "registered"}``."""
    cal = calibration(run, store_url, model_family=model_family)
    reg = registration(run, store_url)
    level = "exploratory"
    if cal["ok"]:
        level = "registered" if reg["ok"] else "calibrated"
    return {"level": level, "calibrated": cal, "registered": reg}


def compute_trust(run, store_url: str, *, model_family: str | None = None) -> str:
    """The trust level this run earns (one of ``LEVELS[:3]``); see the module doc.

    ``model_family``: the loaded model's family name when the caller knows it
    (otherwise read from the model config, no weights). Raises ``SpecError``
    when the run's study was edited after it was frozen or departs from its design.
    """
    return trust_report(run, store_url, model_family=model_family)["level"]
