"""ablate_rescue: ablate a site at the readout token, restore a declared PART of it, re-read the margin.

Grid: pair × layer × component|head, as ``ablate`` (same ``mode``: zero | mean | resample, same ``over``,
``seed``, ``observable.layers/components/pairs``). With ``a`` the ablated site's clean activation (from the
capture pass), ``a'`` its ablated value and Δ = r_chosen − r_rejected (reward units; b cancels), three margins:
  Δ          clean (the capture's own ``W·h + b``)
  Δ_ablated  ``a`` replaced by ``a'`` (``ablate``'s values)
  Δ_rescued  ``a'`` kept, plus the part named by ``restore`` put back (one more re-run per target and side):
    ``{direction: w_r}``         the subspace of the reward direction: every head row (one for a scalar head;
                                 a gated head's gate-averaged direction), orthonormalized
    ``{direction: objective:<name>}``  one head row
    ``{direction: 'store:<url>#<run>/<observable>/<variable>'}``  a stored d_model direction (a probe, a LEACE
                                 or SAE direction saved by an earlier run; read as ``project`` reads it)
    ``{top_pcs: k}``             the top-k principal axes of the ablated site's clean activations over the run's
                                 pairs, both sides (centered; for ``over: head`` in the head's z slice). k = 0
                                 restores nothing
      a subspace S with orthonormal basis U: the site is set to  a' + U Uᵀ (a − a'),  the projection of the
      clean output onto S restored and its complement left ablated (a subspace interchange intervention:
      Geiger et al. 2023, "Finding alignments between interpretable causal variables and distributed neural
      representations"; Makelov et al. 2023, "Is this the subspace you are looking for?")
    ``{site: <resid|attn|mlp>_L<layer>}``  the clean value of that site at the readout token, set in the same
                                 re-run as the ablation: the share of the effect mediated by that site (the
                                 mediation / path logic of Vig et al. 2020 and Wang et al. 2022, "Interpretability
                                 in the Wild"). A site upstream of the ablated one carries nothing (fraction 0);
                                 the ablated site itself restores everything (fraction 1)
Quantities (``quantity``):
  effect          Δ_ablated − Δ                                 (reward units; what ``ablate`` reports)
  rescued_effect  Δ_rescued − Δ                                 (reward units; the damage the part leaves)
  rescue_fraction (Δ_rescued − Δ_ablated) / (Δ − Δ_ablated)     (fraction of the ablation's effect the
                                                                restored part carries; NaN where the
                                                                ablation moves no margin)
Bounds: restoring the whole activation gives 1 and restoring nothing 0 (``tests/test_rescue.py``); between
them the reading is a finding, not an identity — a random direction reads ≈ 0. The fraction is not bounded to
[0, 1] by construction (a part can over- or under-shoot through nonlinear layers).
Default ``restore``: ``{direction: w_r}``. Errors: ``SpecError`` at plan time for an unknown ``quantity``,
``mode``, ``over`` or component, a ``restore`` that is not one of the forms above, an unknown objective or
layer, a direction with ``over: head`` (a head's z slice is not in d_model), and at run time for k larger than
the site's width.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SpecError
from ..registries import OPERATORS
from ._grid import choice, first_pairs, grid_layers, need_site, reward_direction, result
from .ablate import COMPONENT_SITES, Ablate, AblateParams
from .project import check_objective

QUANTITIES = ("effect", "rescued_effect", "rescue_fraction")
RESTORES = ("direction", "top_pcs", "site")


@dataclass(frozen=True)
class AblateRescueParams(AblateParams):
    quantity: str = "rescue_fraction"
    restore: Any = None                # a mapping (see the module doc); None: {direction: w_r}


def parse_restore(restore, info, where: str) -> tuple[str, Any]:
    """``(kind, value)`` of a ``restore`` mapping: ("direction", str) | ("top_pcs", int) | ("site", (site, layer))."""
    r = {"direction": "w_r"} if restore is None else restore
    if not isinstance(r, Mapping) or len(r) != 1 or next(iter(r)) not in RESTORES:
        raise SpecError(where + ".restore", f"expected one key of {list(RESTORES)}, got {r!r}.",
                        fix="e.g. restore: {direction: w_r}, restore: {top_pcs: 2} or restore: {site: mlp_L2}.")
    kind, v = next(iter(r.items()))
    if kind == "direction":
        if not isinstance(v, str) or not (v == "w_r" or v.startswith(("objective:", "store:"))):
            raise SpecError(where + ".restore.direction", f"unknown direction {v!r}.",
                            options=["w_r", "objective:<name>", "store:<url>#<run>/<observable>/<variable>"])
        check_objective(v, info, where + ".restore")
        return kind, v
    if kind == "top_pcs":
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SpecError(where + ".restore.top_pcs", f"must be an integer >= 0, got {v!r}.",
                            fix="e.g. restore: {top_pcs: 2}.")
        return kind, v
    comp, _, layer = str(v).partition("_L")
    if comp not in COMPONENT_SITES or not layer.isdigit() or int(layer) >= info.n_layers:
        raise SpecError(where + ".restore.site", f"unknown site {v!r}.",
                        fix=f"name one as <resid|attn|mlp>_L<layer>, layer 0..{info.n_layers - 1} (e.g. mlp_L1).")
    return kind, (COMPONENT_SITES[comp], int(layer))


def orthonormal(M: np.ndarray) -> np.ndarray:
    """An orthonormal basis (width, k) of the row space of ``M`` (rows, width), float64."""
    if M.size == 0:
        return np.zeros((M.shape[-1], 0))
    _, s, vt = np.linalg.svd(np.asarray(M, np.float64), full_matrices=False)
    return vt[s > s.max() * 1e-10].T if s.size and s.max() > 0 else np.zeros((M.shape[-1], 0))


@OPERATORS.register
class AblateRescue(Ablate):
    """Ablation then rescue of a declared part (a subspace, or a downstream site) at the readout token."""

    name = "ablate_rescue"
    dims = "() → pair × layer × component|head [× objective]"
    Params = AblateRescueParams
    restricted_by = ("layers", "components", "pairs")

    def sites(self, info):
        out = super().sites(info)
        r = self.p.restore
        if isinstance(r, Mapping) and set(r) == {"site"}:
            out = out | {COMPONENT_SITES.get(str(r["site"]).partition("_L")[0], "resid_post")}
        return out

    def out_dims(self, in_dims, info, where):
        choice(self.p.quantity, QUANTITIES, where + ".quantity")
        kind, v = parse_restore(self.p.restore, info, where)
        if kind == "direction" and self.p.over == "head":
            raise SpecError(where + ".restore", "a head's ablated activation is its slice of the attention "
                            "output projection's input, not a d_model vector: a direction cannot be restored there.",
                            fix="use restore: {top_pcs: k} or restore: {site: ...} with over: head.")
        if kind == "site":
            need_site(info, v[0], where)
        return super().out_dims(in_dims, info, where)

    def _basis(self, ctx, targets, kind, v):
        """Per target, the orthonormal basis (width, k) of the restored subspace."""
        if kind == "direction":
            head = ctx.lm.head
            M = head.W if v == "w_r" and head.gate is None else reward_direction(ctx, "head" if v == "w_r" else v)
            U = orthonormal(np.atleast_2d(M))
            return [U] * len(targets)
        out = []
        from ..engine.interventions import head_dim
        hd = head_dim(ctx.lm) if self.p.over == "head" else None
        for site, l, h in targets:
            a = self._acts(ctx, site)[:, :, l].astype(np.float64)
            a = a if hd is None else a[..., h * hd:(h + 1) * hd]
            a = a.reshape(-1, a.shape[-1])                                  # (pair · side) × width
            if v > a.shape[-1]:
                raise SpecError("observable.steps.restore.top_pcs", f"k = {v} exceeds the site's width "
                                f"{a.shape[-1]}.", fix=f"set top_pcs <= {a.shape[-1]}.")
            out.append(orthonormal(np.linalg.svd(a - a.mean(0), full_matrices=False)[2][:v]))
        return out

    def _clean(self, ctx, site, l, h, pairs, side):
        """The captured clean activation of a setting, (len(pairs), width)."""
        a = self._acts(ctx, site)[pairs, side, l]
        if site != "head":
            return a
        from ..engine.interventions import head_dim
        hd = head_dim(ctx.lm)
        return a[..., h * hd:(h + 1) * hd]

    def _rescue(self, ctx, targets, ablated_values):
        """``(targets for the rescued re-run, values(t, pairs, side))``."""
        kind, v = parse_restore(self.p.restore, ctx.info, "observable.steps")
        if kind == "site":
            rs = (v[0], v[1], 0)
            comp = [t if (t[0], t[1]) == rs[:2] else (t, rs) for t in targets]

            def values(t, pairs, side):
                if not isinstance(comp[t][0], tuple):               # the ablated site itself: all of it back
                    return self._clean(ctx, *targets[t], pairs, side)
                return ablated_values(t, pairs, side), self._clean(ctx, *rs, pairs, side)
            return comp, values
        bases = self._basis(ctx, targets, kind, v)

        def values(t, pairs, side):
            ab = np.asarray(ablated_values(t, pairs, side), np.float64)
            U = bases[t]
            return ab + ((self._clean(ctx, *targets[t], pairs, side) - ab) @ U) @ U.T
        return targets, values

    def _margins(self, ctx, targets, vf, pidx):
        from ..engine.interventions import set_readout
        r = []
        for side in (0, 1):
            got, counts = set_readout(ctx.lm, ctx.encoded, ctx.capture, targets,
                                      lambda t, pairs, side=side: vf(t, pairs, side), pidx, base_side=side)
            ctx.add_counts(self.name, counts)
            r.append(got)
        return r[0] - r[1]                                                    # pair × target × output

    def run(self, ctx):
        layers, pidx = grid_layers(ctx.info, self.name), first_pairs(ctx)
        targets, names = self._targets(ctx, layers)
        kind, v = parse_restore(self.p.restore, ctx.info, "observable.steps")
        key = (self.name, self.p.mode, self.p.over, self.p.seed, kind, v, tuple(targets), len(pidx))
        if key not in ctx.memo:
            vf = self.values(ctx, targets)
            rt, rv = self._rescue(ctx, targets, vf)
            ctx.memo[key] = (self._margins(ctx, targets, vf, pidx), self._margins(ctx, rt, rv, pidx))
        ablated, rescued = ctx.memo[key]
        rewards = ctx.lm.head.rewards(ctx.capture.h[pidx]).astype(np.float64)
        clean = (rewards[:, 0] - rewards[:, 1])[:, None]
        if self.p.quantity == "effect":
            data, units = ablated - clean, "reward"
        elif self.p.quantity == "rescued_effect":
            data, units = rescued - clean, "reward"
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                data = np.where(ablated != clean, (rescued - ablated) / (clean - ablated), np.nan)
            units = "fraction"
        data = data.reshape(len(pidx), len(layers), len(names), -1)
        what = f"{kind}: {v if kind != 'site' else self.p.restore['site']}"
        out = result(ctx, data, pidx, ("layer", self.p.over), {"layer": list(layers), self.p.over: names}, units,
                     f"{self.p.mode} ablation at the readout token, then {what} restored: {self.p.quantity}")
        out.attrs.update(mode=self.p.mode, quantity=self.p.quantity, restore=what)
        return out
