"""Spec → plan → one capture pass → operators → xarray → store.

``execute`` is the whole main job for one composed config. The run id is the
hash of what determines the numbers (model fingerprint, dataset checksum, the
observable's expanded steps and version, numerics settings, package version);
paths, time, batch size and launcher are not part of it. A complete run with
the same id is found in the store and not recomputed unless ``store.force``.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import platform
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import xarray as xr
from omegaconf import OmegaConf

from . import __version__
from .errors import SpecError
from .ops.base import PlanInfo
from .paths import conf_dir, group_options
from .registry import build_plan, expand_steps
from .spec import ObservableSpec


def load_observable(name: str) -> ObservableSpec:
    """Read ``conf/observable/<name>.yaml`` into an ``ObservableSpec`` (a fresh copy each call; the
    parse is cached per file version, so building a plan again does not re-read YAML)."""
    path = conf_dir() / "observable" / f"{name}.yaml"
    if not path.is_file():
        raise SpecError("observable", f"unknown observable '{name}'.", value=name, options=group_options("observable"))
    st = path.stat()
    return copy.deepcopy(_parse_observable(str(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=256)
def _parse_observable(path: str, mtime_ns: int, size: int) -> ObservableSpec:
    merged = OmegaConf.merge(OmegaConf.structured(ObservableSpec), OmegaConf.load(path))
    return OmegaConf.to_object(merged)


def model_config(spec, base_dir=None):
    """The transformers config of ``spec`` (a ``ModelSpec``), read without weights."""
    import transformers as tf

    from .models.loading import gguf_for, resolve_source
    from .models.tiny import TINY_CONFIGS, tiny_config

    kind, loc = resolve_source(spec.source, base_dir)
    if kind == "builtin":
        if loc not in TINY_CONFIGS:
            raise SpecError("model.source", f"unknown built-in model '{loc}'.", value=loc, options=TINY_CONFIGS)
        cfg = tiny_config(loc)
    else:
        try:
            gguf = gguf_for(spec, kind, loc)
            cfg = tf.AutoConfig.from_pretrained(loc, **({"gguf_file": gguf} if gguf else {}))
        except (OSError, ValueError) as exc:
            raise SpecError("model.source", f"cannot read the model config at '{spec.source}': "
                            f"{str(exc).splitlines()[0]}") from None
    return cfg


def describe_model(spec, base_dir=None) -> tuple:
    """``(family, n_layers, n_objectives)`` from the model config alone (no weights)."""
    from .models.families import family_for

    cfg = model_config(spec, base_dir)
    n_layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer")
    return family_for(cfg.model_type), int(n_layers), int(spec.num_labels)


def plan_for(run, base_dir=None):
    """Validate the observable against the model's description; return ``(plan, info)``."""
    family, n_layers, k = describe_model(run.model, base_dir)
    objectives = tuple(run.model.objectives) or (("reward",) if k == 1 else tuple(f"objective_{i}" for i in range(k)))
    obs = run.observable
    info = PlanInfo(family=family, n_layers=n_layers, n_objectives=k, objectives=objectives,
                    model_name=run.model.name, layers=tuple(obs.layers) if obs.layers is not None else None,
                    components=tuple(obs.components) if obs.components else None, pairs=obs.pairs,
                    gated=run.model.head.value == "gated")
    check_frame_configs(run, base_dir)
    return build_plan(obs, info, load_observable), info


def _width(cfg) -> int:
    return int(getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd"))


def check_frame_configs(run, base_dir=None) -> None:
    """Plan-time checks of ``frame.partner`` / ``frame.reference`` (configs only, no weights)."""
    from .spec import group_config

    f = run.frame
    if f.reference:
        group_config("dataset", f.reference, key="frame.reference", base_dir=base_dir)
    if f.partner:
        partner = group_config("model", f.partner, key="frame.partner", base_dir=base_dir)
        if partner.name == run.model.name:
            raise SpecError("frame.partner", f"the partner model has the same name as this model ('{partner.name}'); "
                            "a shared frame tells its two models apart by name.",
                            fix="give one of them another model.name, or pick another partner.")
        da, db = _width(model_config(run.model, base_dir)), _width(model_config(partner, base_dir))
        if da != db:
            raise SpecError("frame.partner", f"'{run.model.name}' has d_model {da} but partner '{partner.name}' has "
                            f"{db}; a shared frame aligns two residual streams of one width (orthogonal Procrustes).",
                            fix="pick a partner model of the same d_model.")


def canonical_observable(obs) -> dict:
    steps, outputs = expand_steps(obs, load_observable)
    return {"name": obs.name, "version": obs.version, "steps": steps, "outputs": outputs,
            "layers": obs.layers, "components": obs.components, "pairs": obs.pairs}


def spec_hash(parts: dict) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _versions() -> dict:
    import numpy
    import torch
    import transformers
    import zarr

    return {"reward_lens_spec": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "xarray": xr.__version__, "zarr": zarr.__version__,
            "numpy": numpy.__version__}


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def frame_dependent(plan) -> list[str]:
    """Outputs the run's frame re-expresses: native-frame vectors (a ``d_model`` dim; ``frames.express``).

    Other outputs are gauge-invariant, or frame-dependent but computed and labelled in one basis
    by their operator (e.g. ``objective_geometry``'s cosines); no run frame changes them.
    """
    return [s.name for s in plan.steps if s.name in plan.outputs and s.gauge.startswith("frame:native:")
            and "d_model" in s.dims]


@dataclass
class Outcome:
    run_id: str
    store_url: str
    reused: bool
    result: xr.Dataset | None
    plan: object


KEEP_PREFIX_MAX = 64      # patched rows whose prefix KV cache the capture pass keeps (capture(keep_prefix=))


def compute(lm, pairs, plan, info, *, fmt="plain", template="User: {prompt}\nAssistant: {response}",
            max_length=512, batch_size=16, max_tokens=None, padding_side="left", progress=False, frame=None):
    """Encode ``pairs``, run the one shared capture pass for ``plan``, then every step.

    Frame-dependent outputs are then expressed in ``frame`` (a ``frames.Frame``; ``None`` =
    native, see ``frames.express``). Returns ``(xr.Dataset of the plan's outputs, RunContext,
    EncodedPairs)``.
    """
    from .frames.express import express
    from .context import RunContext
    from .models.capture import capture
    from .models.formatting import encode_pairs

    enc = encode_pairs(lm.tokenizer, list(pairs), fmt=fmt, template=template, max_length=max_length,
                       model_name=lm.name)
    if not enc.pair_ids:
        raise SpecError("dataset", "no pair is left to score after exclusions.", fix="check dataset.limit and filters.")
    n = len(enc.pair_ids)
    rows = {2 * p + side for step in plan.steps for p, side in step.op.prefix_rows(info, n)}
    keep = sorted(rows) if len(rows) <= KEEP_PREFIX_MAX else []     # one KV cache per row is held
    cap = capture(lm, enc, plan.sites, batch_size=batch_size, max_tokens=max_tokens, padding_side=padding_side,
                  progress=progress, keep_prefix=keep)
    ctx = RunContext(lm=lm, pairs=pairs, encoded=enc, capture=cap, info=info)
    ctx.add_counts("capture", cap.counts)
    values: dict[str, xr.DataArray] = {}
    for step in plan.steps:
        values[step.name] = step.op.run(ctx, *[values[s] for s in step.inputs])
        values[step.name].attrs.setdefault("gauge", step.gauge)
    return express(xr.Dataset({o: values[o] for o in plan.outputs}), frame, info.model_name), ctx, enc


def execute(run, *, resolved_yaml: str, base_dir: str, store_url: str, progress: bool = True) -> Outcome:
    """Run one composed, validated config (``RunConfig``) end to end; see the module docstring."""
    from .data import load_pairs
    from .frames.resolve import resolve_frame
    from .models.fingerprint import model_fingerprint
    from .models.loading import load_model
    from .store import is_complete, write_run
    from .trust.gates import compute_trust
    from .trust.studies import check_run

    t0 = time.perf_counter()
    plan, info = plan_for(run, base_dir)                      # every spec error before any model loads
    study = check_run(run, store_url, storage_options=dict(run.store.storage_options))   # edited study: refused
    ds = run.dataset
    pairs = load_pairs(ds.kind.value, path=ds.path, fields=dict(ds.fields) or None, limit=ds.limit,
                       dimensions=ds.dimensions, base_dir=base_dir)
    lm = load_model(run.model, base_dir)
    fp = model_fingerprint(lm.model, lm.tokenizer)
    m = run.model
    numerics = {"dtype": m.dtype.value, "max_length": m.max_length, "format": m.format.value,
                "template": m.template if m.format.value == "plain" else None, "objectives": list(m.objectives)}
    hash_parts = {"model_fingerprint": fp, "model_name": m.name, "dataset_checksum": pairs.checksum,
                  "observable": canonical_observable(run.observable), "numerics": numerics,
                  "package_version": __version__, "study_hash": study["study_hash"] if study else None}
    # fitted once, stored, reused; skipped when no output is a vector the frame would re-express
    frame = resolve_frame(run, lm, store_url, base_dir) if frame_dependent(plan) else None
    if frame is not None:
        hash_parts["frame"] = frame.id
    run_id = f"{run.observable.name}-{spec_hash(hash_parts)[:20]}"
    so = dict(run.store.storage_options)
    if not run.store.force and is_complete(store_url, run_id, storage_options=so):
        return Outcome(run_id, store_url, True, None, plan)
    result, ctx, enc = compute(lm, pairs, plan, info, fmt=m.format.value, template=m.template,
                               max_length=m.max_length, batch_size=m.batch_size, max_tokens=m.max_tokens,
                               padding_side=m.padding_side.value, progress=progress, frame=frame)
    from .frames import Frame, save_frame
    for made in [v for v in ctx.memo.values() if isinstance(v, Frame)]:   # operators' own frames: stored too,
        save_frame(made, store_url, storage_options=so)                    # so every gauge label resolves
    wall = time.perf_counter() - t0
    attrs = {
        "config_yaml": resolved_yaml, "spec_hash": spec_hash(hash_parts), "model": m.name, "model_fingerprint": fp,
        "model_family": lm.family.name, "dataset": ds.name, "dataset_checksum": pairs.checksum,
        "effective_n": {"n": len(pairs), "n_scored": len(enc.pair_ids), "n_unique": pairs.n_unique,
                        "n_prompt_clusters": pairs.n_prompt_clusters},
        "data_flags": {k: len(v) for k, v in pairs.flags.items()},
        "excluded": {k: list(v) for k, v in enc.excluded.items()}, "observable": run.observable.name,
        "observable_version": run.observable.version, "versions": _versions(), "git_sha": _git_sha(),
        "seed": run.seed, "device": lm.device, "dtype": lm.dtype, "wall_s": round(wall, 3),
        "counts": ctx.counts, "trust": compute_trust(run, store_url, model_family=lm.family.name),
        "study_hash": study["study_hash"] if study else None,
        "gauge": {v: str(result[v].attrs.get("gauge", "")) for v in result.data_vars},
        "frame": {"requested": run.frame.name.value, "id": frame.id if frame is not None else None,
                  "expressed_outputs": [v for v in result.data_vars
                                        if frame is not None and result[v].attrs.get("gauge") == frame.gauge]},
    }
    write_run(store_url, run_id, {run.observable.name: result}, attrs, storage_options=so, force=run.store.force)
    return Outcome(run_id, store_url, False, result, plan)
