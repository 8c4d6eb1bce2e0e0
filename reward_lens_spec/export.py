"""``reward-lens-spec export url=STORE run=RUN what=steer|erase|head out=PATH.safetensors [observable=]
[var=] [layer=]``: write an intervention artifact from a stored run (loads no model).

    what=steer   a d_model vector: ``var=`` the output (e.g. a ``mean_direction`` step), ``layer=`` picks one
                 layer where it has a layer dim                         → tensor ``vector``
    what=erase   a LEACE eraser: the run's ``leace_eraser`` outputs (mean ``d_in``, projection ``d_out × d_in``;
                 conf/observable/examples/leace_eraser); ``var=MEAN,PROJECTION`` where there are several
                                                                        → tensors ``mean``, ``projection``
    what=head    a fitted Bradley–Terry head: a ``fit`` run's ``head_weight`` (``var=`` another d_model vector)
                                                                        → tensor ``weight``

The arrays are read through the store's reader (each checked against its sealed digest) and written as they
are stored, dtype and bits unchanged, to ``out`` with the provenance JSON beside it (``out`` with ``.json``):
the run id, store, observable, each variable's sealed digests and selection, the source model's name and
fingerprint, the dataset checksum and the eraser's layer and concept (``models.artifacts``). Apply it with
``model.interventions=[{kind: erase, path: PATH.safetensors, site: resid_post.0}]`` (docs/interventions.md).
Errors go to stderr as one line naming the key, exit code 2.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from .errors import RewardLensError, SpecError
from . import __version__
from .models.artifacts import write
from .store import open_store

KEYS = ("url", "run", "what", "out", "observable", "var", "layer")
WHATS = ("steer", "erase", "head")


def _parse(argv: list[str]) -> dict:
    kv = {}
    for a in argv:
        k, eq, v = a.partition("=")
        if not eq or k not in KEYS:
            raise SpecError(k or a, "unknown export argument.", value=k, options=KEYS,
                            fix="reward-lens-spec export url=STORE run=RUN what=steer|erase|head out=NAME.safetensors")
        kv[k] = v
    for k in ("url", "run", "what", "out"):
        if not kv.get(k):
            raise SpecError(k, "is required.", fix="reward-lens-spec export url=STORE run=RUN what=steer|erase|head "
                            "out=NAME.safetensors")
    if kv["what"] not in WHATS:
        raise SpecError("what", f"unknown artifact {kv['what']!r}.", value=kv["what"], options=WHATS)
    return kv


def _observable(store, kv) -> str:
    names = store.observables(kv["run"])
    if kv.get("observable"):
        if kv["observable"] not in names:
            raise SpecError("observable", f"run {kv['run']} has no observable {kv['observable']!r}.",
                            value=kv["observable"], options=names)
        return kv["observable"]
    if len(names) != 1:
        raise SpecError("observable", f"run {kv['run']} has {len(names)} observables.", options=names,
                        fix="name one with observable=.")
    return names[0]


def _pick(res, kv, want_dims: tuple, default: str | None, what: str) -> str:
    if kv.get("var"):
        if kv["var"] not in res:
            raise SpecError("var", f"no output {kv['var']!r} in this run.", value=kv["var"], options=list(res))
        return kv["var"]
    if default is not None and default in res:
        return default
    hits = [n for n, da in res.items() if set(want_dims) <= set(da.dims) and "pair" not in da.dims]
    if len(hits) != 1:
        raise SpecError("var", f"{len(hits)} outputs of this run could be the {what}.", options=list(res),
                        fix="name it with var=.")
    return hits[0]


def _vector(res, name: str, kv) -> tuple[np.ndarray, dict]:
    da = res[name]
    sel = {}
    if "layer" in da.dims:
        if not kv.get("layer"):
            raise SpecError("layer", f"{name} has a layer dim ({list(da.layer.values)}).", fix="pick one: layer=N.")
        try:
            sel = {"layer": int(kv["layer"])}
            da = da.sel(sel)
        except (KeyError, ValueError):
            raise SpecError("layer", f"no layer {kv['layer']!r} in {name}.", options=[int(x) for x in da.layer.values])
    if da.dims != ("d_model",):
        raise SpecError("var", f"{name} has dims {da.dims}; a steering vector or head is one d_model vector.",
                        fix="name a d_model vector (e.g. a mean_direction step) with var=, and layer= if needed.")
    return np.asarray(da.values), sel


def export(kv: dict) -> tuple[Path, Path]:
    """Write the artifact ``kv`` asks for (module doc); ``(file, provenance file)``."""
    store = open_store(kv["url"])
    obs = _observable(store, kv)
    res = store.load(kv["run"], obs, lazy=False)
    prov = store.provenance(kv["run"])
    digests = (prov.get("data_digests") or {}).get(obs, {})
    used, tensors, extra = {}, {}, {}
    if kv["what"] == "erase":
        names = kv["var"].split(",") if kv.get("var") else []
        if not names:
            means = [n for n, da in res.items() if da.dims == ("d_in",)]
            projs = [n for n, da in res.items() if da.dims == ("d_out", "d_in")]
            if len(means) != 1 or len(projs) != 1:
                raise SpecError("var", f"this run has {len(means)} eraser mean(s) and {len(projs)} projection(s) "
                                "(leace_eraser part: mean / projection).", options=list(res),
                                fix="name them with var=MEAN,PROJECTION.")
            names = [means[0], projs[0]]
        if len(names) != 2 or any(n not in res for n in names):
            raise SpecError("var", f"var={kv['var']!r}: give the mean and the projection, var=MEAN,PROJECTION.",
                            options=list(res))
        mean, proj = np.asarray(res[names[0]].values), np.asarray(res[names[1]].values)
        if mean.ndim != 1 or proj.shape != (mean.size, mean.size):
            raise SpecError("var", f"{names[0]} {mean.shape} and {names[1]} {proj.shape} are not a mean and a "
                            "square projection of one width.", fix="name the leace_eraser outputs.")
        tensors = {"mean": mean, "projection": proj}
        used = {"mean": (names[0], {}), "projection": (names[1], {})}
        a = res[names[1]].attrs
        extra = {k: a.get(k) for k in ("layer", "concept", "n_fit", "classes") if a.get(k) is not None}
    else:
        name = _pick(res, kv, ("d_model",), "head_weight" if kv["what"] == "head" else None,
                     "steering vector" if kv["what"] == "steer" else "head")
        v, sel = _vector(res, name, kv)
        key = "vector" if kv["what"] == "steer" else "weight"
        tensors, used = {key: v}, {key: (name, sel)}
    source = {"store": str(kv["url"]), "run_id": kv["run"], "observable": obs,
              "variables": {t: {"variable": n, "selection": s, "sealed_digest": digests.get(n)}
                            for t, (n, s) in used.items()},
              "model": prov.get("model"), "model_fingerprint": prov.get("model_fingerprint"),
              "dataset_checksum": prov.get("dataset_checksum"), "spec_hash": prov.get("spec_hash"),
              "d_model": int(next(iter(tensors.values())).shape[-1]), "reward_lens_spec": __version__, **extra}
    return write(Path(kv["out"]), kv["what"], tensors, source)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``reward-lens-spec export``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        out, side = export(_parse(argv))
    except RewardLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}\nprovenance {side}")
    return 0
