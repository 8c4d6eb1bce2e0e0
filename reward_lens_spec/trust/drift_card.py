"""The ``training`` scorecard kind: grade ``drift`` on a store holding the training organism's checkpoint sequence.

``grade_drift(url, observable)`` reads the sequence's runs of ``observable`` in store ``url`` (a
``model=tiny_checkpoints model.checkpoint=all`` sweep on the organism's held-out pairs,
``models.training_organism.eval_pairs(n)`` as a JSONL file), computes or reuses their ``drift`` run
(``compare.drift.drift``), rebuilds the truth from the checkpoints themselves (each checkpoint's folder, whose
content digest must equal the one the run recorded, loaded by transformers; every pair side a plain forward,
batch of one, the organism's template; ``trust.drift_criteria.truth_series``), and grades the stored drift
variables with ``trust.drift_criteria``. The card's ``strengths`` are the checkpoint steps and its readings are
per checkpoint. Its ``spec_hash`` is ``drift_spec_hash``: the read observable's content hash and the drift
params. ``calibrate organism=training store.url=STORE [read=checkpoint_dynamics]`` writes it into that store.

A reading that does not fit (a checkpoint missing, a variable absent, NaN) fails its criterion with the reason
(``reading_errors``), never a traceback. Raises ``SpecError`` when the store holds no sequence
(``compare.drift``), when the sequence is not the training organism's checkpoints (``model``), or when its pairs
are not the organism's held-out pairs (``dataset``).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict

import numpy as np

from ..errors import SpecError
from ..models.training_organism import TEMPLATE, resolve, eval_pairs, PLANTED_STEP, truth
from ..models.checkpoints import content_digest
from .coverage import why_not
from .drift_criteria import drift_criteria, truth_series
import torch
from ..models.hub import load_classifier, load_tokenizer
from ..compare.drift import DriftParams, drift, sequence_runs
from ..store import open_store
from .criteria import Criterion
from .evidence import card_verdict, code_hash
from .card import Scorecard, finite_or_none

OBSERVABLE = "drift"


def drift_spec_hash(read_spec_hash: str, params) -> str:
    """What a drift card grades: the read observable's content hash and the drift params."""
    return hashlib.sha256(json.dumps({"observable": OBSERVABLE, "read": read_spec_hash, "params": asdict(params)},
                                     sort_keys=True).encode()).hexdigest()


def _checkpoint_truth(steps, pairs) -> tuple[list, list]:
    """Per checkpoint step: margins (pair) and readout rows (pair-major, chosen then rejected: 2·pairs × d)."""
    margins, hs = [], []
    for step in steps:
        folder = resolve(f"training/checkpoint-{step}")
        model = load_classifier(folder, trust_remote_code=False, num_labels=1, dtype=torch.float32)[0].eval()
        tok = load_tokenizer(folder, trust_remote_code=False)
        got: list = []
        hook = model.model.norm.register_forward_hook(lambda mod, args, out: got.append(out[0, -1].double()))
        m, rows = [], []
        try:
            with torch.no_grad():
                for p in pairs:
                    r = []
                    for side in (p.chosen, p.rejected):
                        ids = tok(TEMPLATE.format(prompt=p.prompt, response=side))["input_ids"]
                        got.clear()
                        r.append(float(model(input_ids=torch.tensor([ids])).logits[0, 0].double()))
                        rows.append(got[-1].numpy())
                    m.append(r[0] - r[1])
        finally:
            hook.remove()
        margins.append(np.asarray(m))
        hs.append(np.asarray(rows))
    return margins, hs


def _organism_pairs(st, runs):
    """The organism's held-out pairs the sequence was scored on (``SpecError`` naming the dataset otherwise)."""
    ids = [str(p) for p in st.load(runs[0][0], runs[0][1]["observable"], lazy=False)["margin"]["pair"].values]
    pairs = list(eval_pairs(len(ids) // 2)) if len(ids) % 2 == 0 else []
    if [p.id for p in pairs] != ids:
        raise SpecError("dataset", f"the sequence was scored on pairs {ids[:3]}…, not the training organism's "
                        "held-out pairs: its planted step shows on pairs that end in '!' or '.'.",
                        fix="sweep on training_organism.eval_pairs(n) written as JSONL (dataset=jsonl "
                            "dataset.path=...), as docs/instruments.md shows")
    return pairs


def grade_drift(url: str, observable: str = "checkpoint_dynamics", model: str | None = None, params=None):
    """A ``trust.scorecard.Scorecard`` of ``drift`` on the training organism sequence in ``url`` (module doc)."""
    t0 = time.perf_counter()
    params = params or DriftParams(n_null=200, n_boot=50)
    st = open_store(url)
    runs = sequence_runs(st, observable, model)
    steps = [int(p["checkpoint"]["step"]) for _, p in runs]
    for rid, p in runs:
        d = content_digest(f"organism:training/checkpoint-{p['checkpoint']['step']}")
        if d != p["checkpoint"]["content_sha256"]:
            raise SpecError("model", f"run {rid} read a checkpoint whose content digest {p['checkpoint']['content_sha256'][:12]} "
                            f"is not the training organism's checkpoint-{p['checkpoint']['step']} ({d[:12]}).",
                            fix="sweep model=tiny_checkpoints (the training organism) into a fresh store.")
    pairs = _organism_pairs(st, runs)
    drift_id, ds, _ = drift(url, observable, model, params)
    margins, hs = _checkpoint_truth(steps, pairs)
    series = truth_series(margins, hs)
    t = {"steps": steps, "planted_step": PLANTED_STEP, "series": series}
    shown = {k: np.where(np.isfinite(v), v, None).tolist() for k, v in series.items()}
    k = next(i for i, s in enumerate(steps) if s > PLANTED_STEP) if any(s > PLANTED_STEP for s in steps) else None
    card = Scorecard(observable=OBSERVABLE, spec_hash=drift_spec_hash(runs[0][1].get("observable_spec_hash"), params),
                     version=1, model_family=str(runs[0][1].get("model_family")), organism="training",
                     base=str(runs[0][1]["model"]).split("@", 1)[0], strengths=steps,
                     truth={"planted_step": PLANTED_STEP, "planted_interval": None if not k else
                            f"step{steps[k - 1]} -> step{steps[k]}", "series": shown},
                     organism_checksum=str(runs[0][1].get("dataset_checksum")),
                     organism_params={**truth(), "read": observable, "drift_run": drift_id, "params": asdict(params)},
                     organism_fingerprints=[p.get("model_fingerprint") for _, p in runs])
    crits = drift_criteria(Criterion)
    used = {v for c in crits for v in c.needs}
    card.graded = sorted(v for v in ds.data_vars if v in used)
    card.ungraded = sorted(v for v in ds.data_vars if v not in used)
    card.why_not = {v: why_not(v, "training") for v in card.ungraded}
    card.scope = {"family": card.model_family, "organism": "training", "base": card.base, "strengths": steps,
                  "n_pairs": len(pairs), "drift_run": drift_id}
    for c in crits:
        try:
            vals = np.asarray(c.reading(ds, t), np.float64).reshape(-1)
            if vals.size != len(steps):
                raise ValueError(f"{vals.size} readings for {len(steps)} checkpoints")
            fv = float(c.floor_value(ds, t))
            card.readings[c.name] = [finite_or_none(v) for v in vals]
            card.floors[c.name] = {"value": finite_or_none(fv), "floor": c.floor, "what": c.floor_what,
                                   "at_strength": steps[-1]}
        except Exception as exc:       # noqa: BLE001  a reading that does not fit its criterion fails the card
            card.reading_errors[c.name] = f"{type(exc).__name__}: {exc}"
            card.readings[c.name] = [None] * len(steps)
            card.floors[c.name] = {"value": None, "floor": c.floor, "what": c.floor_what, "at_strength": steps[-1]}
        card.spearman[c.name] = None               # no strength axis (drift_criteria.UNDOSED)
        one = {k: getattr(card, k) for k in ("truth", "spearman", "floors", "magnitude", "reading_errors")}
        card.criteria_passed[c.name] = card_verdict({**one, "readings": {c.name: card.readings[c.name]}},
                                                    check_code=False)[0]
    card.code_hash = code_hash()
    card.passed = card_verdict(asdict(card))[0]
    card.wall_s = round(time.perf_counter() - t0, 3)
    return card
