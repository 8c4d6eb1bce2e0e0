"""Design pins: what a preregistered study fixes — by content, not by name.

``pins(run)`` = ``{observable_spec_hash, model_fingerprint, dataset_checksum}``
for a validated ``RunConfig``: the observable's canonical content hash (expanded
steps, outputs, version, restrictions), the loaded model's weight-and-tokenizer
fingerprint, and the checksum of the pairs the run would read. ``execute``
records the same three values in every run, so a run matches a study only when
it ran the same instrument on the same weights and data. ``design_run`` composes
the config a study's design describes (``experiment=<name>`` for a study file;
``group=option`` / ``group.key=value`` overrides for an in-memory design).
"""
from __future__ import annotations

import yaml
from ..paths import group_options
from ..inputs import load_dataset, load_lm
from ..run.compose import compose_run

PIN_KEYS = ("observable_spec_hash", "model_fingerprint", "dataset_checksum")
_GROUPS = ("model", "dataset", "observable", "frame")


def _overrides(design: dict) -> list[str]:
    out = []
    for group in _GROUPS:
        node = design.get(group)
        if not isinstance(node, dict):
            continue
        for k, v in node.items():
            if k == "name" and v in group_options(group):
                out.insert(0, f"{group}={v}")
            else:
                value = yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()
                out.append(f"{group}.{k}={value}")
    return out


def design_run(experiment, study: dict):
    """The ``RunConfig`` a study's design describes (``experiment``: a study name or the study dict)."""
    overrides = [f"experiment={experiment}"] if isinstance(experiment, str) else \
        _overrides(study.get("design") or {})
    return compose_run(overrides, typed=[])[0]


def pins(run, base_dir: str) -> dict:
    """The three pins of ``run`` (loads the model and the pairs; reads no results)."""
    from ..models.fingerprint import model_fingerprint
    from ..identity import observable_hash

    pairs = load_dataset(run.dataset, base_dir)
    lm = load_lm(run.model, base_dir)
    return {"observable_spec_hash": observable_hash(run.observable),
            "model_fingerprint": model_fingerprint(lm.model, lm.tokenizer), "dataset_checksum": pairs.checksum}
