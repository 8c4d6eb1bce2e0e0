"""Exactness identities a run checks on its own outputs, against the model's own margin.

The reference margin is ``Δ = r(chosen) − r(rejected)`` from the model's own head
output at the readout token (``CaptureResult.logits``, the HF forward pass), not
from any operator. Where an output variable of that name is present and covers
the whole model:

==================  =================================================  ==========================
variable            identity                                           applies when
==================  =================================================  ==========================
``dla``             Σ over (layer, component) of dla = Δ               embedding + every layer
``lens``            normed lens at the last layer = Δ                  last layer present
``patch_restored``  restored fraction at (last layer, resid) = 1       (err scaled by |Δ|)
``patch_effect``    |effect at (last layer, resid)| = |Δ|              denoise or noise
reward / margin     = the head's own reward per side / Δ, every cell     always (see ``claims_reward``)
per-token reward    Σ over position = the head's own reward per side   an implicit run: pair × side ×
                    (DPO-implicit: β·Σ_t log π/π_ref; exact)            position, units reward
PRM aggregate       = the declared rule (``signal.aggregate``, else     an output with an ``aggregate``
                    its own attr) over σ(per-step rewards)              attr beside a step grid
PRM step reward     at the readout step (``signal.step``) = the head's   a PRM run (``PrmSignal``)
                    own reward per side
LEACE certificate   the fresh probe's held-out AUC after erasure has    an output stage × bound with
                    a CI containing 0.5 (the erasure holds on pairs     stage ``after`` (``leace_
                    it was not fitted on)                               certificate``)
==================  =================================================  ==========================

A certificate record (``held_out_record``) carries its interval (``interval``, ``target`` 0.5, scale 1 in
AUC units); ``evidence.identities_ok`` re-derives its verdict from the interval on every read, so a run or
a card whose erasure leaks on held-out pairs (a fresh probe still reads the concept, AUC CI above or below
0.5) cannot read ``calibrated``. Source of the test: Belrose et al. 2023 (LEACE), §6: a fresh probe on the
erased representation.

On a generative judge (``JudgeSignal``) the head is the verdict row ``W_U[yes] − W_U[no]``, so Δ is the
verdict margin and the ``dla`` identity is recorded as "sum of dla = verdict margin".

An output *claims* to be a reward or a margin (``claims_reward``) when it is named ``reward``,
``rewards`` or ``margin`` (the names the ``score`` criterion and readers take as the model's own
score) and has no dimension besides ``pair``, ``side`` and ``objective`` (an ``objective`` axis
only where the head has those outputs): a per-side one must equal the head output ``W·h + b`` of that
side, a per-pair one ``Δ``. This holds on every organism a card grades and on the run itself
(``seal_run``), so a scaled margin or a lens read at an inner layer under the name ``margin`` breaks
an identity. Restricted grids (a partial ``dla`` or ``patch`` grid) keep their identities on the
organisms: ``trust.reference.reference_identities`` checks every kept cell against the same cell
from a plain HF forward pass.

Each record: ``{variable, identity, max_abs_err, scale, dtype, n}`` with ``scale``
the margin scale ``max(RMS(Δ), eps·RMS(r))`` in reward units (``eps`` the dtype's
relative precision, so a near-zero margin does not demand more than the dtype
holds). The verdict (``evidence.identities_ok``) is re-derived on read: max |err| ≤
``IDENTITY_RTOL[dtype]`` × scale. A broken identity keeps the run from
``calibrated`` and fails a scorecard. Source: DLA and the lens are linear in the
residual stream once the final norm is frozen (Elhage et al. 2021, *A Mathematical
Framework for Transformer Circuits*); patching the whole last residual replaces
the readout input, so it restores the source reward exactly.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from ..arrays import str_index
from .certificate import certificate_gap
from ..kinds.prm.steps import aggregate

_EPS = {"float64": 1e-6, "float32": 1e-6, "bfloat16": 1e-2, "float16": 2e-3}


def _margin(logits: np.ndarray, pair_ids, objectives) -> tuple[xr.DataArray, float]:
    lg = np.asarray(logits, np.float64)
    m = lg[:, 0] - lg[:, 1]
    reward_rms = float(np.sqrt(np.mean(lg ** 2))) if lg.size else 0.0
    if m.shape[-1] == 1:
        return xr.DataArray(m[:, 0], dims=("pair",), coords={"pair": str_index(pair_ids)}), reward_rms
    return xr.DataArray(m, dims=("pair", "objective"),
                        coords={"pair": str_index(pair_ids), "objective": list(objectives)}), reward_rms


def identity_record(var, what, err: xr.DataArray, margin: xr.DataArray, reward_rms, dtype) -> dict | None:
    e = np.abs(np.asarray(err.values, np.float64))
    e = np.where(np.isinf(e), 1e30, e)          # an infinite error (missing or non-finite cell): JSON-safe
    e = e[np.isfinite(e)]
    if e.size == 0:
        return None
    mv = np.asarray(margin.values, np.float64)
    scale = max(float(np.sqrt(np.mean(mv ** 2))), _EPS.get(dtype, 1e-6) * reward_rms)
    return {"variable": var, "identity": what, "max_abs_err": float(e.max()), "scale": scale,
            "dtype": dtype, "n": int(e.size)}


ROLE_NAMES = ("reward", "rewards", "margin")
_ROLE_DIMS = {"pair", "side", "objective"}


def claims_reward(name: str, da: xr.DataArray) -> str | None:
    """``"reward"`` (per side) or ``"margin"`` when output ``name`` claims that role, else None."""
    n = str(name).lower()
    if n not in ROLE_NAMES:
        return None
    if "pair" not in da.dims or not set(da.dims) <= _ROLE_DIMS:
        return None
    return "reward" if "side" in da.dims else "margin"


def _rewards(logits, pair_ids, objectives) -> xr.DataArray:
    lg = np.asarray(logits, np.float64)
    dims, coords = ("pair", "side"), {"pair": str_index(pair_ids), "side": ["chosen", "rejected"]}
    if lg.shape[-1] == 1:
        return xr.DataArray(lg[..., 0], dims=dims, coords=coords)
    return xr.DataArray(lg, dims=dims + ("objective",), coords={**coords, "objective": list(objectives)})


def check_identities(result: xr.Dataset, logits, pair_ids, *, n_layers: int, objectives=(),
                     dtype: str = "float32", signal=None) -> list[dict]:
    """Identity records (see module doc) for every applicable output of ``result``.

    ``logits``: pair × side × output, the model's own head output (reward units). ``signal``: the model's
    ``LoadedModel.signal`` (judge, PRM or implicit; None for a classifier): the kind's own identities.
    A non-finite margin or reading counts as an infinite error.
    """
    margin, rr = _margin(logits, pair_ids, objectives)
    out = []
    last = n_layers - 1

    def add(var, what, err):
        rec = identity_record(var, what, err, margin, rr, dtype)
        if rec:
            out.append(rec)

    for var in result.data_vars:                 # outputs that claim to be the head's reward or margin
        da = result[var]
        role = claims_reward(var, da)
        if role is None:
            continue
        ref = margin if role == "margin" else _rewards(logits, pair_ids, objectives)
        if "objective" in ref.dims and "objective" not in da.dims:
            ref = ref.isel(objective=0) if ref.sizes["objective"] == 1 else ref
        if set(ref.dims) != set(da.dims):      # e.g. per-objective rewards of a gated head: no such logits
            continue
        d, r = xr.align(da.astype(np.float64), ref, join="left")
        err = (d - r)
        if "side" in da.dims:
            err = err.sel(side=[x for x in ("chosen", "rejected") if x in err.side.values])
        add(var, f"{role} = the head's own {role}", err.fillna(np.inf))
    if "dla" in result and {"layer", "component"} <= set(result["dla"].dims):
        da = result["dla"]
        if set(range(-1, n_layers)) <= set(int(x) for x in da.layer.values):
            what = "sum of dla = verdict margin" if getattr(signal, "kind", None) == "judge" else "sum of dla = margin"
            add("dla", what, (da.sum(("layer", "component"), skipna=True) - margin).fillna(np.inf))
    if "lens" in result and "layer" in result["lens"].dims and last in result["lens"].layer.values:
        add("lens", "normed lens at the last layer = margin", (result["lens"].sel(layer=last) - margin).fillna(np.inf))
    for var, what in (("patch_restored", "patching the last resid restores 1"),
                      ("patch_effect", "|patch effect at the last resid| = |margin|")):
        da = result.get(var)
        if da is None or not {"layer", "component"} <= set(da.dims):
            continue
        if last not in da.layer.values or "resid" not in da.component.values:
            continue
        cell = da.sel(layer=last, component="resid")
        err = (cell - 1) * abs(margin) if var == "patch_restored" else abs(cell) - abs(margin)
        err = err.where(np.isfinite(cell) | ~np.isfinite(margin))     # pairs outside observable.pairs: NaN
        if var == "patch_restored":
            err = err.where(margin != 0)
        add(var, what, err)
    _kind_identities(result, logits, pair_ids, objectives, signal, add)
    out.extend(r for r in (held_out_record(v, result[v]) for v in result.data_vars) if r)
    return out


def held_out_record(var: str, da: xr.DataArray) -> dict | None:
    """The certificate record of ``var`` when it is a LEACE certificate (stage × bound with stage ``after``):
    ``max_abs_err`` = how far 0.5 lies outside the after-erasure AUC interval (0 inside; AUC units)."""
    if set(da.dims) != {"stage", "bound"} or "after" not in da.stage.values \
            or not {"ci_low", "ci_high"} <= set(str(b) for b in da.bound.values):
        return None
    lo, hi = (float(da.sel(stage="after", bound=b)) for b in ("ci_low", "ci_high"))
    return {"variable": var, "identity": "held-out probe AUC after erasure: its CI contains 0.5",
            "max_abs_err": certificate_gap([lo, hi], 0.5), "scale": 1.0, "dtype": "float64", "n": 1,
            "interval": [lo if np.isfinite(lo) else None, hi if np.isfinite(hi) else None], "target": 0.5}



def _kind_identities(result, logits, pair_ids, objectives, signal, add) -> None:
    """Per-token rewards sum to the reward; a PRM's aggregate follows its rule, its readout step is the reward.
    The per-side reference (``_rewards``: a pair index of ``pair_ids``) is built only when an output is checked
    against it (a DLA or lens run has none; at 100,000 pairs it was 13.5 MB of the heap at its peak)."""
    if np.shape(logits)[-1] != 1:            # several objectives: no per-kind identity
        return
    held: list = []

    def rewards() -> xr.DataArray:
        if not held:
            held.append(_rewards(logits, pair_ids, objectives))
        return held[0]

    steps = [v for v in result.data_vars if set(result[v].dims) == {"pair", "side", "step"}
             and result[v].attrs.get("units") == "reward"]
    for var in result.data_vars:
        da = result[var]
        if (getattr(signal, "kind", None) == "implicit" and set(da.dims) == {"pair", "side", "position"}
                and da.attrs.get("units") == "reward"):    # (a classifier's prefix_reward is per prefix, no sum)
            total = da.astype(np.float64).sum("position", skipna=True).where(da.notnull().any("position"))
            add(var, "sum of per-token reward = reward", (total - rewards()).fillna(np.inf))
        elif "aggregate" in da.attrs and steps and set(da.dims) <= {"pair", "side"}:
            rule = getattr(signal, "aggregate", None) or da.attrs["aggregate"]
            st = result[steps[0]].transpose("pair", "side", "step")
            want = xr.DataArray(aggregate(st.values, rule), dims=("pair", "side"),
                                coords={"pair": st.pair.values, "side": st.side.values})
            if "side" not in da.dims:
                want = want.sel(side="chosen") - want.sel(side="rejected")
            add(var, f"aggregate = '{rule}' over σ(step rewards)", (da - want).fillna(np.inf))
    k = getattr(signal, "step", None) if getattr(signal, "kind", None) == "prm" else None
    if steps and k is not None and k >= -1:
        st = result[steps[0]].transpose("pair", "side", "step")
        n = np.sum(np.isfinite(st.values), -1)
        idx = np.full(n.shape, k) if k >= 0 else n - 1
        got = np.take_along_axis(st.values, np.clip(idx, 0, st.sizes["step"] - 1)[..., None], -1)[..., 0]
        got = np.where((idx >= 0) & (idx < n), got, np.inf)
        err = xr.DataArray(got, dims=("pair", "side"), coords={"pair": st.pair.values, "side": st.side.values})
        add(steps[0], "step reward at the readout step = reward", err - rewards())
