"""A study document, as written: its schema, hash, id and predictions (no store access).

See ``trust.studies`` for the lifecycle (freeze, run, adjudicate); this module holds what reading a
study needs, so the store's reader can verify evidence without importing the writers.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from ..errors import SpecError
from ..paths import find_config, group_options
from omegaconf import OmegaConf

COMPARATORS = {">": np.greater, "<": np.less, ">=": np.greater_equal, "<=": np.less_equal}
REDUCTIONS = {"mean": np.mean, "median": np.median, "sum": np.sum, "min": np.min, "max": np.max,
              "fraction_positive": lambda x: np.mean(x > 0)}


def load_study(experiment) -> dict:
    """A study dict from a name (``conf/experiment/<name>.yaml``) or a mapping; validated."""
    if isinstance(experiment, str):
        path = find_config("experiment", experiment)                # built-in or a user's config folder
        if path is None:
            raise SpecError("experiment", f"unknown experiment '{experiment}'.", value=experiment,
                            options=group_options("experiment"))
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        raw.pop("defaults", None)
        study = raw.get("experiment", raw)
    else:
        study = OmegaConf.to_container(experiment, resolve=True) if OmegaConf.is_config(experiment) \
            else json.loads(json.dumps(dict(experiment)))
    validate_study(study)
    return study


def validate_study(study: dict) -> None:
    """Raise ``SpecError`` (``experiment.<key>``) unless ``study`` has the schema in the module doc."""
    if not isinstance(study, dict) or not isinstance(study.get("name"), str) or not study["name"]:
        raise SpecError("experiment.name", "a study needs a name.", fix="add `name: my_study` under experiment:.")
    hyps = study.get("hypotheses")
    if not isinstance(hyps, list) or not hyps:
        raise SpecError("experiment.hypotheses", "a study needs at least one hypothesis with predictions.",
                        fix="add `hypotheses: [{statement: ..., predictions: [...]}]` under experiment:.")
    seen = set()
    for i, h in enumerate(hyps):
        preds = h.get("predictions") if isinstance(h, dict) else None
        if not isinstance(preds, list) or not preds:
            raise SpecError(f"experiment.hypotheses[{i}].predictions", "each hypothesis needs predictions.",
                            fix="add `predictions: [{metric: {variable: margin}, "
                                "comparator: '>', threshold: 0}]` to it.")
        for j, p in enumerate(preds):
            where = f"experiment.hypotheses[{i}].predictions[{j}]"
            m = p.get("metric") if isinstance(p, dict) else None
            if not isinstance(m, dict) or not isinstance(m.get("variable"), str):
                raise SpecError(where + ".metric", "needs a metric with a `variable` (an output variable).",
                                fix="e.g. metric: {variable: margin, reduce: mean}.")
            for key, val, opts in (("metric.reduce", m.get("reduce", "mean"), REDUCTIONS),
                                   ("comparator", p.get("comparator"), COMPARATORS)):
                if val not in opts:
                    raise SpecError(f"{where}.{key}", f"unknown {key.split('.')[-1]}.", value=val, options=opts)
            if not isinstance(p.get("threshold"), (int, float)) or isinstance(p.get("threshold"), bool):
                raise SpecError(where + ".threshold", "needs a number.", fix="e.g. threshold: 0.")
            pid = p.get("id") or f"H{i + 1}.P{j + 1}"
            if pid in seen:
                raise SpecError(where + ".id", f"duplicate prediction id '{pid}'.",
                                fix="give each prediction its own id (or leave id out: it defaults to H<i>.P<j>).")
            seen.add(pid)


def study_hash(study: dict) -> str:
    """sha256 hex of the canonical JSON (sorted keys, no spaces) of the study."""
    return hashlib.sha256(json.dumps(study, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def study_id(study: dict) -> str:
    return f"{study['name']}-{study_hash(study)[:12]}"


def predictions(study: dict) -> list[dict]:
    """Flat list of predictions, each with ``id`` and ``hypothesis`` filled in."""
    out = []
    for i, h in enumerate(study["hypotheses"]):
        for j, p in enumerate(h["predictions"]):
            out.append({**p, "id": p.get("id") or f"H{i + 1}.P{j + 1}", "hypothesis": h.get("id", f"H{i + 1}")})
    return out
