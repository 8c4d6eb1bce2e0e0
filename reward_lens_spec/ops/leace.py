"""leace: erase a concept linearly at a site (LEACE, fitted on one split of pairs) and re-read the margin on
the held-out split.

The eraser r(x) = x − W⁺PW(x − μ) (``ops._leace``; Belrose et al. 2023, "LEACE: Perfect linear concept
erasure in closed form") is fitted on the readout-token activations at ``site`` of ``layer`` (both sides)
of the fit split (``fit_fraction`` of the pairs, by a seeded hash of the pair id), against the one-hot
``concept`` (``dimension`` | ``field:concept|subset|label`` | ``length`` | ``tokens`` with ``tokens: [...]``;
see ``ops._leace``). On every held-out pair (the first ``observable.pairs``) both sides are re-run with
the site's activation at the readout token replaced by its erased value (exact: copies of the readout
token over the cached prefix, ``engine.interventions.set_readout``).
``quantity``: ``margin_change`` = Δ_erased − Δ per held-out pair (pair; reward units; NaN on fit-split
pairs): what the margin loses when the model can no longer read the concept linearly at that site;
``displacement`` = mean over the two sides of ‖r(x) − x‖ / ‖x‖ (pair; fraction; no re-run): how far the
erasure moves the activation (≈ 0 for a concept the site does not carry). Summarize
it with ``mean_ci``; certify the erasure with ``leace_certificate`` (a fresh probe's AUC). Attrs:
``n_fit`` (pairs), ``classes``. Gauge: invariant. Errors: ``SpecError`` for an unknown concept or site,
a layer out of range, ``fit_fraction`` outside (0, 1), or a fit split holding fewer than two classes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecError
from ..registries import OPERATORS
from ._grid import choice, first_pairs, need_site, result
from ._leace import FIELDS, check_concept, erase, fit_leace, in_split, labels, one_hot
from .base import INVARIANT, Operator, need_dim

SITES = ("resid_post", "attn_out", "mlp_out")


@dataclass(frozen=True)
class LeaceParams:
    layer: int
    concept: str = "dimension"
    tokens: tuple = ()
    site: str = "resid_post"
    fit_fraction: float = 0.5
    seed: int = 0
    quantity: str = "margin_change"   # margin_change | displacement


def check_leace(p, info, where: str) -> None:
    if not (isinstance(p.layer, int) and 0 <= p.layer < info.n_layers):
        raise SpecError(where + ".layer", f"layer {p.layer!r} out of range; valid 0..{info.n_layers - 1}.",
                        fix=f"set layer: <0..{info.n_layers - 1}> in the step.")
    check_concept(p.concept, p.tokens, where)
    if not 0 < p.fit_fraction < 1:
        raise SpecError(where + ".fit_fraction", f"must be in (0, 1), got {p.fit_fraction!r}.",
                        fix="e.g. fit_fraction: 0.5 in the step.")


def check_readout_input(p, in_dims, info, where: str) -> None:
    """Plan check shared by the operators that fit an eraser on an input step: ``pair``, ``side``, ``d_model``
    present, and ``layer`` valid when the input has that dim (``SpecError`` naming the key otherwise)."""
    for d in ("pair", "side", "d_model"):
        need_dim(in_dims, d, where, "readout-token activations of both sides")
    if "layer" in in_dims:
        check_leace(p, info, where)
    elif p.layer is not None:
        raise SpecError(where + ".layer", "the input has no layer dim.", fix="drop layer:.")


def readout_eraser(ctx, p, x):
    """The input's activations at ``p.layer`` as float64 (pair, side, d_model), and ``fitted_eraser`` on them:
    ``(X, pair ids, fit, labels, mu, E)``."""
    if "layer" in x.dims:
        x = x.sel(layer=p.layer)
    ids = [str(i) for i in x.coords["pair"].values]
    X = np.asarray(x.transpose("pair", "side", "d_model").values, np.float64)
    return (X, ids) + fitted_eraser(ctx, p, X, ids)


def fitted_eraser(ctx, p, X: np.ndarray, pair_ids):
    """``(fit mask (pair,), labels (pair, side), mu, E)`` for activations X (pair, side, d)."""
    fit = in_split(pair_ids, str(p.seed), p.fit_fraction)
    y = labels(ctx, p.concept, p.tokens, fit)
    if np.unique(y[fit]).size < 2:
        raise SpecError("observable.steps.concept", f"the fit split ({int(fit.sum())} pairs) holds fewer than two "
                        f"values of concept '{p.concept}'; nothing to erase.",
                        fix="add pairs, change fit_fraction/seed, or choose a concept that varies.")
    Xf = X[fit].reshape(-1, X.shape[-1])
    mu, E = fit_leace(Xf, one_hot(y[fit].ravel()))
    return fit, y, mu, E


@OPERATORS.register
class Leace(Operator):
    """LEACE concept erasure at a site, fitted on one split, applied to the other: Δ_erased − Δ per pair."""

    name = "leace"
    dims = "() → pair [× objective]"
    Params = LeaceParams
    n_inputs = 0
    reruns = True
    per_pair = True
    needs_all_pairs = True         # the eraser is fitted on every fit-split pair: the run is one chunk
    restricted_by = ("pairs",)
    pair_fields = FIELDS

    def sites(self, info):
        return {self.p.site}

    def prefix_rows(self, info, n_pairs):
        n = n_pairs if info.pairs is None else min(info.pairs, n_pairs)
        return {(p, s) for p in range(n) for s in (0, 1)}

    def out_dims(self, in_dims, info, where):
        check_leace(self.p, info, where)
        choice(self.p.site, SITES, where + ".site")
        choice(self.p.quantity, ("margin_change", "displacement"), where + ".quantity")
        need_site(info, self.p.site, where)
        return ("pair",) + (("objective",) if info.n_outputs > 1 and self.p.quantity == "margin_change" else ())

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx):
        from ..engine.interventions import set_readout
        p, enc = self.p, ctx.encoded
        X = ctx.capture.sites[p.site][:, :, p.layer].astype(np.float64)                   # pair × side × d
        fit, y, mu, E = fitted_eraser(ctx, p, X, enc.pair_ids)
        pidx = [i for i in first_pairs(ctx) if not fit[i]]
        if p.quantity == "displacement":
            Xh = X[pidx]
            moved = np.linalg.norm(erase(Xh, mu, E) - Xh, axis=-1) / np.linalg.norm(Xh, axis=-1)
            out = result(ctx, moved.mean(1)[:, None], pidx, (), {}, "fraction",
                         f"relative displacement ‖r(x) − x‖/‖x‖ of LEACE erasure of '{p.concept}' at {p.site}[{p.layer}]")
            out.attrs.update(n_fit=int(fit.sum()), concept=p.concept)
            return out
        key = (self.name, p.layer, p.site, p.concept, tuple(p.tokens), p.fit_fraction, p.seed, len(pidx))
        if key not in ctx.memo:
            r = []
            for side in (0, 1):
                got, counts = set_readout(ctx.lm, enc, ctx.capture, [(p.site, p.layer, 0)],
                                          lambda t, pairs, side=side: erase(X[pairs, side], mu, E), pidx,
                                          base_side=side) if pidx else (np.zeros((0, 1, ctx.lm.head.n_outputs)), {})
                ctx.add_counts(self.name, counts)
                r.append(got[:, 0])
            ctx.memo[key] = r[0] - r[1]                                                   # pair × output
        rewards = ctx.lm.head.rewards(ctx.capture.h[pidx]).astype(np.float64)
        data = ctx.memo[key] - (rewards[:, 0] - rewards[:, 1])
        out = result(ctx, data, pidx, (), {}, "reward",
                     f"margin change under LEACE erasure of '{p.concept}' at {p.site}[{p.layer}] (held-out pairs)")
        out.attrs.update(n_fit=int(fit.sum()), classes=[str(c) for c in np.unique(y[fit])], concept=p.concept,
                         method="exact re-run at the readout token; eraser: LEACE closed form (Belrose et al. 2023)")
        return out
