"""sae_attribution: attribute the margin to the features of a TopK sparse autoencoder at the readout, and
patch single features through the intervention machinery.

The SAE (``engine.sae``; Gao et al. 2024, "Scaling and evaluating sparse autoencoders") is either loaded
from ``path`` (a folder in SAE-Lens' format: ``cfg.json`` + ``sae_weights.safetensors``) or trained in the
run, seeded (``d_sae``, ``k``, ``epochs``, ``lr``, ``batch``, ``seed``), on ``train_on``:
  ``run``                                      this run's own activations at ``site`` (every pair, both
                                               sides; the run is then one chunk, as for ``leace``)
  ``store:<url>#<run>/<observable>/<variable>``  activations saved by an earlier run (a ``capture`` step),
                                               streamed ``chunk`` pairs at a time, never held whole
A loaded SAE is pinned by ``digest`` (sha256 of k and its float32 weights, ``TopKSAE.digest``), checked at
plan time, so the run id — which hashes the params — covers the weights read from ``path``; the Fix of a
missing or stale digest names the folder's. Steps with equal SAE params share one SAE (trained once per
process). Its digest is in the ``sae`` attr.

``site``: ``readout`` (h, the final norm's output at the readout token) or ``resid_post`` with ``layer``.
At the readout the margin is linear in h — Δ = w·(h_c − h_r), w = W[k] the reward direction (b cancels)
— and h = Σ_i f_i(h) d_i + b_dec + e(h) holds exactly, so with no approximation
    Δ = Σ_i (f_i(h_c) − f_i(h_r)) (w·d_i)  +  w·(e_c − e_r)          (b_dec cancels too)
``quantity``:
  contribution    (f_i(h_c) − f_i(h_r)) (w·d_i)    pair × feature [× objective]; reward units; readout only
  error           w·(e_c − e_r)                    pair [× objective]; reward units; readout only
                  (Σ_feature contribution + error = Δ to float64 rounding; the ``identity_residual`` attr
                  is the largest |Σ + error − Δ| over the chunk, Δ from the capture's own W·h + b)
  activation_diff f_i(h_c) − f_i(h_r)              pair × feature; activation units
  patch_effect    one feature edited in the SAE's latent space at the readout token (the error term
                  kept), the model re-run from there (``engine.interventions.set_readout``, one packed
                  forward per pair and side over every feature; exact at the readout token):
                  ``mode: transplant``: the rejected side's f_i set to the chosen side's value
                  (x_r + (f_i(x_c) − f_i(x_r)) d_i); effect = r_rejected,patched − r_rejected, the
                  denoising convention of activation patching (Heimersheim & Nanda 2024): the reward the
                  feature restores to the rejected side, + when the feature carries the margin; the
                  margin change Δ_patched − Δ is its negative (the description attr says so)
                  ``mode: zero``: f_i set to 0 on both sides; effect = Δ_zeroed − Δ
                  pair × feature [× objective]; reward units. At the readout transplant equals
                  ``contribution`` and zero equals −``contribution`` (the head is linear in h); at
                  resid_post it is the feature's causal effect through the layers above.
                  Only on the first ``observable.pairs`` pairs (NaN on the rest); the other quantities
                  need no re-run and cover every pair.
  variance_explained  1 − Σ‖h − ĥ‖² / Σ‖h − h̄‖² of the SAE on this model's readout h, every pair and both sides
  relative_error      ‖H − Ĥ‖_F / ‖H‖_F, the same rows (``reconstruction``); both scalars (units fraction),
                  computed after the last chunk on the stored readout (site ``readout`` only: a SpecError
                  elsewhere); the run attr ``sae`` seals them and ``trust.sae_gate`` keeps every attribution
                  output of an SAE below 0.7 variance explained here (or not measured) exploratory, with the reason.
``base_model``: the model the SAE was trained on (SAEs are trained on base LMs and attached to fine-tuned ones,
SAELens #436/#469); null takes the SAE folder's ``model_name`` (this run's model for an SAE trained here); a
declared one the folder contradicts is a SpecError. Recorded on every output as ``sae_base_model``.
Gated heads: the gate is frozen at each side's h (as ``project`` reads them), so the direction w_s differs
by side and the exact form is Σ_i [f_i(h_c)(w_c·d_i) − f_i(h_r)(w_r·d_i)] + [w_c·e_c − w_r·e_r +
(w_c − w_r)·b_dec] (the same numbers as above when w_c = w_r); patch_effect there is the model's own
re-read (the gate moves with the edit), so it need not equal the contribution.
Trust: exploratory (the default of every output; an attribution through a learned dictionary is not
calibrated by construction — a feature is confirmed only by its ``patch_effect``). Gauge: invariant.
Errors: ``SpecError`` for an unknown ``quantity``/``site``/``mode``/``train_on``, contribution or error
asked at a site where Δ is not linear (``site``), a layer out of range, non-positive
sizes, ``k`` > ``d_sae``, an unreadable or non-TopK SAE (``path``), a missing or stale ``digest``, or an
SAE whose ``d_in`` is not the site's width (``path``).
"""
from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Optional

import numpy as np

from ..errors import SpecError
from ..registries import OPERATORS
from ._grid import choice, first_pairs, need_site, result
from .base import INVARIANT, Operator
from ..engine.sae import load_sae, rows_of, train_sae
import xarray as xr

QUANTITIES = ("contribution", "error", "activation_diff", "patch_effect", "variance_explained", "relative_error")
LINEAR = ("contribution", "error")
FIT = ("variance_explained", "relative_error")      # how well the SAE reconstructs this model (reduce stage)
SAE_FIELDS = ("site", "layer", "path", "digest", "train_on", "d_sae", "k", "epochs", "lr", "batch", "chunk", "seed")
PATCH_DESCRIPTION = {             # what patch_effect computes, per mode (the sign a reader needs)
    "transplant": "change in the rejected side's reward r_r,patched − r_r with one SAE feature set to the chosen "
                  "side's value at {where} (denoising; + when the feature carries the margin; the margin change "
                  "Δ_patched − Δ is its negative; exact re-run)",
    "zero": "margin change Δ_zeroed − Δ with one SAE feature set to 0 on both sides at {where} (exact re-run)",
}
_STORED: dict = {}                     # SAE params → SAE trained from a store (a few, per process)


@dataclass(frozen=True)
class SaeAttributionParams:
    quantity: str = "contribution"
    site: str = "readout"              # readout | resid_post
    layer: Optional[int] = None        # resid_post only
    path: Optional[str] = None         # SAE-Lens folder; None: train one (below)
    digest: Optional[str] = None       # with path: the SAE's sha256 (engine.sae.TopKSAE.digest), pinned
    train_on: str = "run"              # run | store:<url>#<run>/<observable>/<variable>
    d_sae: int = 32
    k: int = 4
    epochs: int = 30
    lr: float = 0.01
    batch: int = 64
    chunk: int = 256                   # pairs per streamed training chunk
    seed: int = 0
    mode: str = "transplant"           # patch_effect: transplant | zero
    base_model: Optional[str] = None   # the model the SAE was trained on (null: the SAE folder's cfg, or this one)


def check_params(p, info, where: str) -> None:
    choice(p.quantity, QUANTITIES, where + ".quantity")
    choice(p.site, ("readout", "resid_post"), where + ".site")
    choice(p.mode, ("transplant", "zero"), where + ".mode")
    if p.quantity in FIT and p.site != "readout":
        raise SpecError(where + ".site", f"'{p.quantity}' is measured on every pair's stored readout activations; "
                        f"at {p.site} they are not kept past their chunk.",
                        fix="measure the fit with site: readout (an SAE over the final-norm output).")
    if p.site == "resid_post":
        need_site(info, "resid_post", where)
        if not (isinstance(p.layer, int) and 0 <= p.layer < info.n_layers):
            raise SpecError(where + ".layer", f"site resid_post needs a layer in 0..{info.n_layers - 1}, "
                            f"got {p.layer!r}.", fix=f"set layer: <0..{info.n_layers - 1}> in the step.")
        if p.quantity in LINEAR:
            raise SpecError(where + ".site", f"'{p.quantity}' is an exact linear decomposition of the margin; "
                            "the margin is linear in the activation only at the readout (after the final norm).",
                            fix="use site: readout, or quantity: patch_effect at resid_post.")
    if p.path is not None:
        loaded = load_sae(p.path, where + ".path")
        got, named = loaded.digest(), loaded.metadata.get("model_name")
        if p.base_model is not None and named not in (None, p.base_model):
            raise SpecError(where + ".base_model", f"the SAE at '{p.path}' says it was trained on {named!r}, not "
                            f"{p.base_model!r}.", fix=f"set base_model: {named} (or drop base_model to take the SAE's).")
        if p.digest != got:
            raise SpecError(where + ".digest", ("a loaded SAE is pinned by its digest, so the run id covers its "
                            "weights; none given." if p.digest is None else
                            f"the SAE at '{p.path}' has digest {got}, not {p.digest}: it changed."),
                            fix=f"set digest: {got} (after checking this is the SAE you mean).")
    else:
        if not (p.train_on == "run" or (p.train_on.startswith("store:") and "#" in p.train_on
                                        and len(p.train_on.partition("#")[2].split("/")) == 3)):
            raise SpecError(where + ".train_on", f"unknown source '{p.train_on}'.",
                            options=["run", "store:<url>#<run>/<observable>/<variable>"])
        for f in ("d_sae", "k", "epochs", "batch", "chunk"):
            if not (isinstance(getattr(p, f), int) and getattr(p, f) >= 1):
                raise SpecError(f"{where}.{f}", f"must be an integer >= 1, got {getattr(p, f)!r}.",
                                fix=f"set {f}: <an integer ≥ 1> in the step.")
        if not (isinstance(p.lr, (int, float)) and p.lr > 0):
            raise SpecError(where + ".lr", f"must be a number > 0, got {p.lr!r}.", fix="e.g. lr: 0.01 in the step.")
        if p.k > p.d_sae:
            raise SpecError(where + ".k", f"k ({p.k}) exceeds d_sae ({p.d_sae}).", fix="set k <= d_sae.")


def sae_key(p) -> tuple:
    """The params an SAE depends on (steps that differ only in quantity or mode share one)."""
    return tuple(getattr(p, f) for f in SAE_FIELDS)


def _stored_sae(p: SaeAttributionParams, ctx):
    """Train on a stored capture variable (read through the run's stores, ``RunContext.stored``), streamed
    ``p.chunk`` pairs at a time, once per process and params: ``(sae, stats, the variable's gauge)``."""
    key = sae_key(p)
    if key not in _STORED:
        while len(_STORED) >= 4:
            _STORED.pop(next(iter(_STORED)))
        _STORED[key] = _train_stored(p, ctx)
    return _STORED[key]


def _train_stored(p, ctx):
    da = ctx.stored(p.train_on, lazy=True, where="observable.steps.train_on")
    var = da.name
    if "layer" in da.dims:
        if p.layer not in list(da["layer"].values):
            raise SpecError("observable.steps.layer", f"stored '{var}' has layers {list(da['layer'].values)}, "
                            f"not {p.layer!r}.",
                            fix=f"set layer: to one of {list(da['layer'].values)}, or store that layer.")
        da = da.sel(layer=p.layer)
    if set(da.dims) != {"pair", "side", "d_model"}:
        raise SpecError("observable.steps.train_on", f"stored '{var}' has dims {da.dims}; expected readout "
                        "activations (pair × side × d_model).", fix="store a {op: capture} step's output.")
    da = da.transpose("pair", "side", "d_model")
    sae, stats = train_sae(rows_of(da, p.chunk), int(da.sizes["d_model"]), p.d_sae, p.k, epochs=p.epochs, lr=p.lr,
                           batch=p.batch, seed=p.seed)
    return sae, stats, da.attrs.get("gauge")


@OPERATORS.register
class SaeAttribution(Operator):
    """Margin attribution to TopK SAE features at the readout (exact, + error term), and feature patching."""

    name = "sae_attribution"
    dims = "() → pair × feature [× objective], or pair [× objective] (error)"
    Params = SaeAttributionParams
    n_inputs = 0
    reruns = True
    per_pair = True
    restricted_by = ("pairs",)

    @property
    def needs_all_pairs(self):                # trained on this run's activations: every pair, one chunk
        return self.p.path is None and self.p.train_on == "run"

    @property
    def reads_capture(self):                  # the fit: every pair's stored readout h, after the last chunk
        return self.p.quantity in FIT

    def sites(self, info):
        return {"resid_post"} if self.p.site == "resid_post" else set()

    def prefix_rows(self, info, n_pairs):
        if self.p.quantity != "patch_effect":
            return set()
        n = n_pairs if info.pairs is None else min(info.pairs, n_pairs)
        return {(p, s) for p in range(n) for s in (0, 1)}

    def out_dims(self, in_dims, info, where):
        check_params(self.p, info, where)
        if self.p.quantity in FIT:
            return ()
        obj = ("objective",) if info.n_outputs > 1 and self.p.quantity != "activation_diff" else ()
        return ("pair",) + (() if self.p.quantity == "error" else ("feature",)) + obj

    def gauge(self, in_gauges, info):
        return INVARIANT

    def _acts(self, ctx) -> np.ndarray:
        cap = ctx.capture
        return cap.h if self.p.site == "readout" else cap.sites["resid_post"][:, :, self.p.layer]

    def sae(self, ctx):
        p = self.p
        key = ("sae",) + sae_key(p)
        if key not in ctx.memo:
            if p.path is not None:
                sae = load_sae(p.path, "observable.steps.path")
                if sae.digest() != p.digest:                                      # changed since planning
                    raise SpecError("observable.steps.digest", f"the SAE at '{p.path}' changed since the plan "
                                    f"(digest {sae.digest()}, pinned {p.digest}).", fix="rerun.")
                ctx.memo[key] = (sae, {})
            elif p.train_on == "run":
                X = self._acts(ctx)
                ctx.memo[key] = train_sae(rows_of(X, p.chunk), X.shape[-1], p.d_sae, p.k, epochs=p.epochs,
                                          lr=p.lr, batch=p.batch, seed=p.seed)
            else:
                sae, stats, gauge = _stored_sae(p, ctx)
                if gauge not in (None, ctx.info.native_frame):
                    raise SpecError("observable.steps.train_on", f"the stored activations are in '{gauge}', this "
                                    f"run's model reads '{ctx.info.native_frame}'.",
                                    fix="train on activations captured from this model.")
                ctx.memo[key] = (sae, stats)
        sae, stats = ctx.memo[key]
        if sae.d_in != ctx.lm.d_model:
            raise SpecError("observable.steps.path", f"the SAE reads d_in = {sae.d_in}, the site {p.site} of "
                            f"'{ctx.lm.name}' has width {ctx.lm.d_model}.",
                            fix="use an SAE trained on this model's activations at this site.")
        return sae, stats

    def base_model(self, ctx, sae) -> str:
        """What the SAE was trained on: ``base_model`` as declared, else the SAE folder's ``model_name``, else
        (trained in this run or on a store) this run's model; ``"unknown"`` for a folder that names none."""
        if self.p.base_model is not None:
            return str(self.p.base_model)
        if self.p.path is not None:
            return str(sae.metadata.get("model_name") or "unknown")
        return str(ctx.lm.name)

    def run(self, ctx):
        p = self.p
        if p.quantity in FIT:
            return self._fit(ctx)
        pidx = first_pairs(ctx) if p.quantity == "patch_effect" else list(range(len(ctx.encoded.pair_ids)))
        sae, stats = self.sae(ctx)
        X = self._acts(ctx)[pidx].astype(np.float64)                                  # pair × side × d
        f = sae.encode(X)                                                             # pair × side × d_sae
        df = f[:, 0] - f[:, 1]
        feats = {"feature": list(range(sae.d_sae))}
        if p.quantity == "activation_diff":
            out = result(ctx, df[..., None], pidx, ("feature",), feats, "activation",
                         f"SAE feature activation difference f(x_c) − f(x_r) at {self._where()}")
        elif p.quantity in LINEAR:
            cap, D = ctx.capture, np.asarray(sae.W_dec, np.float64)
            g = None if cap.gate is None else cap.gate[pidx]
            w = np.asarray(ctx.lm.head.directions(cap.h[pidx], g), np.float64)      # pair × side × output × d
            wd = np.einsum("psod,fd->psfo", w, D)                                     # w_side · d_i
            contrib = f[:, 0, :, None] * wd[:, 0] - f[:, 1, :, None] * wd[:, 1]      # pair × feature × output
            e = sae.error(X)
            err = np.einsum("pod,pd->po", w[:, 0], e[:, 0]) - np.einsum("pod,pd->po", w[:, 1], e[:, 1]) \
                + (w[:, 0] - w[:, 1]) @ np.asarray(sae.b_dec, np.float64)             # 0 for a linear head
            r = ctx.lm.head.rewards(cap.h[pidx], g).astype(np.float64)
            resid = float(np.abs(contrib.sum(1) + err - (r[:, 0] - r[:, 1])).max()) if pidx else 0.0
            if p.quantity == "contribution":
                out = result(ctx, contrib, pidx, ("feature",), feats, "reward",
                             "margin contribution (f_i(h_c) − f_i(h_r))·(w·d_i) of each SAE feature at the readout")
            else:
                out = result(ctx, err, pidx, (), {}, "reward", "SAE reconstruction-error term w·(e_c − e_r) of "
                             "the margin at the readout")
            out.attrs["identity_residual"] = resid
        else:
            out = result(ctx, self._patch(ctx, sae, X, f, pidx), pidx, ("feature",), feats, "reward",
                         PATCH_DESCRIPTION[p.mode].format(where=self._where()))
            out.attrs["mode"] = p.mode
        out.attrs.update(sae=sae.digest(), site=self._where(), k=sae.k, d_sae=sae.d_sae, quantity=p.quantity,
                         sae_base_model=self.base_model(ctx, sae),
                         **({"train_fvu": round(stats["fvu"], 6)} if stats else {}))
        return out

    def _fit(self, ctx):
        """variance_explained / relative_error of the SAE on every pair's readout h, both sides (``reconstruction``)."""
        sae, _ = self.sae(ctx)
        fit = reconstruction(sae, self._acts(ctx))
        q = self.p.quantity
        out = xr.DataArray(fit[q])
        out.attrs = {"units": "fraction", "gauge": INVARIANT, "description": {
            "variance_explained": "1 − Σ‖h − ĥ‖² / Σ‖h − h̄‖² of the SAE on this model's readout h (every pair, both "
                                  "sides)",
            "relative_error": "‖H − Ĥ‖_F / ‖H‖_F of the SAE on this model's readout h (every pair, both sides)"}[q],
            "sae": sae.digest(), "site": self._where(), "k": sae.k, "d_sae": sae.d_sae, "quantity": q,
            "sae_base_model": self.base_model(ctx, sae), "n_rows": fit["n_rows"]}
        return out


    def _where(self) -> str:
        return "readout" if self.p.site == "readout" else f"resid_post[{self.p.layer}]"

    def _patch(self, ctx, sae, X, f, pidx):
        from ..engine.interventions import set_readout
        p, D = self.p, np.asarray(sae.W_dec, np.float64)
        key = ("sae_patch", astuple(p), len(pidx))
        if key in ctx.memo:
            return ctx.memo[key]
        layer = ctx.lm.n_layers - 1 if p.site == "readout" else p.layer
        targets = [(p.site, layer, 0)] * sae.d_sae
        pos = {q: j for j, q in enumerate(pidx)}

        def values(side, delta):
            return lambda t, pairs: X[[pos[q] for q in pairs], side] + delta[[pos[q] for q in pairs], t, None] * D[t]
        r = ctx.lm.head.rewards(ctx.capture.h[pidx]).astype(np.float64)              # pair × side × output
        runs = [(1, f[:, 0] - f[:, 1])] if p.mode == "transplant" else [(0, -f[:, 0]), (1, -f[:, 1])]
        got = {}
        for side, delta in runs:
            out, counts = set_readout(ctx.lm, ctx.encoded, ctx.capture, targets, values(side, delta), pidx,
                                      base_side=side) if pidx else (np.zeros((0, sae.d_sae, r.shape[-1])), {})
            ctx.add_counts(self.name, counts)
            got[side] = out - r[:, side][:, None]                                     # pair × feature × output
        ctx.memo[key] = got[1] if p.mode == "transplant" else got[0] - got[1]
        return ctx.memo[key]


def reconstruction(sae, acts) -> dict:
    """How well ``sae`` reconstructs ``acts`` (…, d_in; every leading index a row), float64:
    ``variance_explained`` = 1 − Σ‖h − ĥ‖² / Σ‖h − h̄‖² (h̄ the mean row; the complement of the fraction of
    variance unexplained, Gao et al. 2024 §2) and ``relative_error`` = ‖H − Ĥ‖_F / ‖H‖_F; ``n_rows``."""
    H = np.asarray(acts, np.float64).reshape(-1, sae.d_in)
    sse = float((sae.error(H) ** 2).sum())
    sst = float(((H - H.mean(0)) ** 2).sum())
    return {"variance_explained": 1.0 - sse / sst if sst > 0 else float("nan"),
            "relative_error": float(np.sqrt(sse / max(float((H ** 2).sum()), 1e-300))), "n_rows": int(H.shape[0])}
