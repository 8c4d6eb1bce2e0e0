"""hodge_rank: how much of a preference flow no ranking can express (HodgeRank).

Jiang, Lim, Yao & Ye (2011), "Statistical ranking and combinatorial Hodge theory", Math.
Program. 127:203–244. Pairs sharing a ``group`` (``ops/pair_labels``; default: the prompt) form
one comparison graph: nodes are its distinct responses (exact text), an edge joins two responses
compared at least once. Each comparison of ``i`` over ``j`` gives a value on edge (i, j), summed
into an edge flow ``Y_ij = −Y_ji`` = the mean value, edge weight ``w_ij`` = number of comparisons:

  flow labels  the human label: ``2·agreement − 1`` where annotator agreement is recorded, else
               +1 for the chosen side (``Y ∈ [−1, 1]``).
  flow model   the model's margin Δ = r_c − r_r of that comparison (reward units).

Under the inner product ⟨X, Y⟩_w = Σ_edges w_ij X_ij Y_ij the flow splits orthogonally into
  gradient   Y_ij = s_i − s_j for potentials s (what a Bradley–Terry score can fit; weighted
             least squares),
  curl       the image of curl* (curl Y on triangle ijk = Y_ij + Y_jk + Y_ki; local 3-cycles),
  harmonic   the rest (cycles longer than any triangle; dim = cycle rank − rank of curl).
Reported as fractions of ‖Y‖²_w; ``non_gradient_fraction`` = curl + harmonic. A scalar reward's
margins are a gradient flow by construction, so the model flow of a one-row head reads 0 up to
rounding; binary labels of a transitive order do NOT read 0 (a triangle a>b>c, coded ±1, has 1/9),
which is why the null matters.

Null (a permutation of response ranks): each group's responses get a uniformly random total
order and every edge keeps its weight and |Y_ij| but points the way that order says — a
perfectly transitive flow with the observed magnitudes on the observed graph. ``null_mean``,
``null_q95`` and ``p_value`` = (1 + #{null ≥ observed}) / (1 + n_perm) (Phipson & Smyth 2010)
are over ``n_perm`` such orders. ``pooled: true`` sums energies over groups with cycle rank ≥ 1
(a tree has nothing but a gradient); ``pooled: false`` reports each group with at least
``min_responses`` responses.

Output: ``flow × group × hodge_statistic`` (``flow × hodge_statistic`` pooled); mixed units
(fractions, probability, counts: see ``STATISTICS``), gauge invariant. Reduces over pairs.
Errors: ``SpecError`` at plan time for an input that is not a margin (pair) or bad params; at
run time when no group has ``min_responses`` responses (fix: map ``dataset.fields.group``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled, need_dim
from .pair_labels import pair_agreement, pair_groups

STATISTICS = {"non_gradient_fraction": "fraction", "gradient_fraction": "fraction", "curl_fraction": "fraction",
              "harmonic_fraction": "fraction", "null_mean": "fraction", "null_q95": "fraction",
              "p_value": "probability", "n_responses": "count", "n_edges": "count", "n_triangles": "count",
              "cycle_rank": "count", "n_comparisons": "count", "n_groups": "count"}
FLOWS = ("labels", "model")


@dataclass(frozen=True)
class HodgeRankParams:
    pooled: bool = False
    min_responses: int = 3
    n_perm: int = 1000
    seed: int = 0


@dataclass
class Graph:
    """One comparison graph: edges (i < j), edge flow ``y`` and weights ``w`` (E,), triangles (T × 3)."""

    n_nodes: int
    edges: np.ndarray
    y: np.ndarray
    w: np.ndarray
    triangles: np.ndarray
    n_comparisons: int

    def operators(self) -> tuple[np.ndarray, np.ndarray]:
        """Gradient (E × V: s_i − s_j) and curl (T × E: Y_ij + Y_jk − Y_ik) incidence matrices."""
        E = len(self.edges)
        G = np.zeros((E, self.n_nodes))
        G[np.arange(E), self.edges[:, 0]] = 1.0
        G[np.arange(E), self.edges[:, 1]] = -1.0
        index = {(int(a), int(b)): e for e, (a, b) in enumerate(self.edges)}
        C = np.zeros((len(self.triangles), E))
        for t, (i, j, k) in enumerate(self.triangles):
            C[t, index[(i, j)]], C[t, index[(j, k)]], C[t, index[(i, k)]] = 1.0, 1.0, -1.0
        return G, C

    def cycle_rank(self) -> int:
        """E − V + (connected components): the dimension of the flows no potential fits."""
        parent = list(range(self.n_nodes))

        def find(a):
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a
        for a, b in self.edges:
            parent[find(int(a))] = find(int(b))
        return len(self.edges) - self.n_nodes + len({find(a) for a in range(self.n_nodes)})


def build_graph(winners, losers, values) -> Graph:
    """Comparison graph of one group from responses (winner, loser: hashable) and per-comparison values."""
    nodes = sorted({*winners, *losers})
    idx = {n: k for k, n in enumerate(nodes)}
    acc: dict[tuple[int, int], list] = {}
    n_comp = 0
    for a, b, v in zip(winners, losers, values):
        i, j = idx[a], idx[b]
        if i == j or not np.isfinite(v):
            continue
        key, sign = ((i, j), 1.0) if i < j else ((j, i), -1.0)
        acc.setdefault(key, []).append(sign * float(v))
        n_comp += 1
    edges = np.array(sorted(acc), np.int64).reshape(-1, 2)
    y = np.array([np.mean(acc[tuple(e)]) for e in edges], np.float64)
    w = np.array([len(acc[tuple(e)]) for e in edges], np.float64)
    es = {tuple(e) for e in edges.tolist()}
    tri = [(i, j, k) for (i, j) in es for k in range(j + 1, len(nodes)) if (j, k) in es and (i, k) in es]
    return Graph(len(nodes), edges, y, w, np.array(sorted(tri), np.int64).reshape(-1, 3), n_comp)


def _orth(M: np.ndarray) -> np.ndarray:
    return scipy.linalg.orth(M) if M.size else np.zeros((M.shape[0], 0))


def decompose(g: Graph, flows: np.ndarray) -> np.ndarray:
    """Energies (..., 3) = ‖gradient‖²_w, ‖curl‖²_w, ‖harmonic‖²_w of flows (..., E) on graph ``g``.

    Exact orthogonal projections: with Ỹ = W^{1/2}Y, gradient = projection onto col(W^{1/2}G),
    curl = projection onto col(W^{-1/2}Cᵀ) (orthogonal to it because CG = 0), harmonic = rest.
    """
    G, C = g.operators()
    sw = np.sqrt(g.w)
    yt = flows * sw
    Qg, Qc = _orth(G * sw[:, None]), _orth(C.T / sw[:, None])
    total = (yt * yt).sum(-1)
    grad = ((yt @ Qg) ** 2).sum(-1)
    curl = ((yt @ Qc) ** 2).sum(-1)
    return np.stack([grad, curl, np.clip(total - grad - curl, 0.0, None)], -1)


def null_flows(g: Graph, n_perm: int, rng) -> np.ndarray:
    """(n_perm, E): |Y| on each edge, oriented by a uniformly random total order of the responses."""
    ranks = rng.permuted(np.broadcast_to(np.arange(g.n_nodes), (n_perm, g.n_nodes)), axis=1)
    up = ranks[:, g.edges[:, 0]] > ranks[:, g.edges[:, 1]]
    return np.where(up, 1.0, -1.0) * np.abs(g.y)


def _fractions(energy: np.ndarray) -> np.ndarray:
    total = energy.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, energy / total, np.nan)


def _row(energy, null_energy, graphs) -> dict:
    f = _fractions(energy)
    nf = _fractions(null_energy)
    ng_null = nf[:, 1] + nf[:, 2]
    obs = f[1] + f[2]
    ok = np.isfinite(ng_null)
    p = (1.0 + np.sum(ng_null[ok] >= obs - 1e-12)) / (1.0 + ok.sum()) if np.isfinite(obs) and ok.any() else np.nan
    return {"non_gradient_fraction": obs, "gradient_fraction": f[0], "curl_fraction": f[1], "harmonic_fraction": f[2],
            "null_mean": float(ng_null[ok].mean()) if ok.any() else np.nan,
            "null_q95": float(np.quantile(ng_null[ok], 0.95)) if ok.any() else np.nan, "p_value": p,
            "n_responses": sum(g.n_nodes for g in graphs), "n_edges": sum(len(g.edges) for g in graphs),
            "n_triangles": sum(len(g.triangles) for g in graphs), "cycle_rank": sum(g.cycle_rank() for g in graphs),
            "n_comparisons": sum(g.n_comparisons for g in graphs), "n_groups": len(graphs)}


@OPERATORS.register
class HodgeRank(Operator):
    """Gradient / curl / harmonic split of label and model preference flows per comparison group."""

    name = "hodge_rank"
    pair_fields = ("agreement", "group", "votes")
    dims = "margin (pair) → flow × [group ×] hodge_statistic"
    Params = HodgeRankParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], "pair", where, "a margin per pair")
        if tuple(in_dims[0]) != ("pair",):
            raise SpecError(where + ".input", f"needs a margin with dims (pair,), got {in_dims[0]}.",
                            fix="feed it the 'margin' step of the score observable (select one objective first).")
        if self.p.min_responses < 3:
            raise SpecError(where + ".min_responses",
                            f"a cycle needs at least 3 responses, got {self.p.min_responses}.",
                            fix="set min_responses: 3 or more.")
        if self.p.n_perm < 1:
            raise SpecError(where + ".n_perm", f"must be ≥ 1, got {self.p.n_perm}.", fix="e.g. n_perm: 1000.")
        return ("flow", "hodge_statistic") if self.p.pooled else ("flow", "group", "hodge_statistic")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, margin):
        by_id = {p.id: p for p in ctx.pairs}
        pairs = [by_id[i] for i in ctx.encoded.pair_ids]
        groups = pair_groups(ctx)
        agree = pair_agreement(ctx)
        values = {"labels": np.where(np.isfinite(agree), 2.0 * agree - 1.0, 1.0),
                  "model": np.asarray(margin.sel(pair=list(ctx.encoded.pair_ids)).values, np.float64)}
        rng = np.random.Generator(np.random.PCG64(self.p.seed))
        names = sorted({g for g in groups})
        members = {g: np.flatnonzero(groups == g) for g in names}
        rows: dict[str, list] = {f: [] for f in FLOWS}
        kept: list[str] = []
        for gname in names:
            idx = members[gname]
            responses = {pairs[i].chosen for i in idx} | {pairs[i].rejected for i in idx}
            if len(responses) < self.p.min_responses:
                continue
            kept.append(gname)
            for f in FLOWS:
                g = build_graph([pairs[i].chosen for i in idx], [pairs[i].rejected for i in idx], values[f][idx])
                e = decompose(g, g.y) if len(g.edges) else np.full(3, np.nan)
                ne = decompose(g, null_flows(g, self.p.n_perm, rng)) if len(g.edges) else np.full((1, 3), np.nan)
                rows[f].append((g, e, ne))
        if not kept:
            raise SpecError("dataset.fields.group", f"no comparison group has {self.p.min_responses} or more responses "
                            f"({len(names)} groups over {len(pairs)} pairs).",
                            fix="give pairs a shared 'group' (map dataset.fields.group=<key>) or several pairs per "
                                "prompt over ≥ 3 distinct responses.")
        stats = list(STATISTICS)
        if self.p.pooled:
            data = []
            for f in FLOWS:
                cyc = [(g, e, ne) for g, e, ne in rows[f] if g.cycle_rank() >= 1 and np.isfinite(e).all()]
                if cyc:
                    r = _row(np.sum([e for _, e, _ in cyc], 0), np.sum([ne for _, _, ne in cyc], 0),
                             [g for g, _, _ in cyc])
                else:
                    r = {s: np.nan for s in stats} | {"n_groups": 0}
                data.append([r[s] for s in stats])
            arr = xr.DataArray(np.array(data, np.float64), dims=("flow", "hodge_statistic"),
                               coords={"flow": list(FLOWS), "hodge_statistic": stats})
        else:
            data = [[[_row(e, ne, [g])[s] for s in stats] for g, e, ne in rows[f]] for f in FLOWS]
            arr = xr.DataArray(np.array(data, np.float64), dims=("flow", "group", "hodge_statistic"),
                               coords={"flow": list(FLOWS), "group": np.array(kept, dtype=str),
                                       "hodge_statistic": stats})
        out = labelled(arr, "statistic", INVARIANT, "HodgeRank split of the preference flow (fractions of ‖Y‖²_w)")
        out.attrs.update(n_perm=int(self.p.n_perm), seed=int(self.p.seed), units_by_statistic=dict(STATISTICS),
                         null="random total order of each group's responses, |Y| and weights kept")
        return out
