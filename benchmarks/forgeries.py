"""Subtle forgeries, kept apart from the tests (issue 37, "Done when"): each breaks one instrument slightly —
inside the one executor, so the forged output is what the run itself returns — and is graded through the real
``calibrate`` command (``trust.cli.calibrate_main``: organism family, grade, card written to a store); the card
must fail. Prints one table row per forgery: what was forged, the kind, the card (PASS / FAIL) and the
criterion (or identity) that failed it, with the card's reason.

A forgery edits the outputs ``run.executor.compute`` hands back (what a broken operator would return: the
identities and criteria then read them), or builds the organism's model with a wrong setting (the ensemble's
quantile). Replacing a function at run time changes the card's code hash, which alone would fail every card;
the verdict here is re-derived with ``check_code=False`` (the forged code stands for the code under test), so a
forgery fails only where a criterion or an identity catches it. Nothing here is collected by pytest. Usage::

    python benchmarks/forgeries.py [--only NAME ...] [--markdown]

Exit status 1 when any forgery passes calibration.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

LEACE_YAML = """name: leace_concept
version: 1
steps:
  - {name: resid, op: capture, site: resid_post}
  - {name: certificate, op: leace_certificate, input: resid, layer: 2, concept: "field:concept", resamples: 200}
  - {name: displacement, op: leace, layer: 2, concept: "field:concept", quantity: displacement}
  - {name: unplanted_displacement, op: leace, layer: 2, concept: "field:label", quantity: displacement}
outputs: [certificate, displacement, unplanted_displacement]
"""


# -- forged outputs: each takes the outputs dict (name -> DataArray) and edits copies ----------------------

def lens_lag_half(res):
    """lens: every other pair read one layer late (each layer shows the previous layer's value)."""
    da = res["lens"].transpose("pair", ..., "layer")
    v = da.values.copy()
    v[::2, ..., 1:] = v[::2, ..., :-1].copy()
    res["lens"] = da.copy(data=v).transpose(*res["lens"].dims)


def dla_mlp_4pct(res):
    """dla: the mlp component 4 % high at every layer."""
    da = res["dla"].copy()
    da.loc[dict(component="mlp")] = da.sel(component="mlp") * 1.04
    res["dla"] = da


def patch_swap_l1(res):
    """patch_effect: attn and mlp of layer 1 swapped (their sum, and every other cell, kept)."""
    da = res["patch_effect"].copy()
    a, m = da.sel(layer=1, component="attn").values.copy(), da.sel(layer=1, component="mlp").values.copy()
    da.loc[dict(layer=1, component="attn")] = m
    da.loc[dict(layer=1, component="mlp")] = a
    res["patch_effect"] = da


def judge_half_4pct(res):
    """judge margin: 4 % high on every other pair (rewards and the rest kept)."""
    v = res["margin"].values.copy()
    v[::2] *= 1.04
    res["margin"] = res["margin"].copy(data=v)


def prm_leak(res):
    """step_reward: 5 % of each step's reward leaked into the next step (never into the readout step); step
    margins recomputed from the leaked rewards."""
    da = res["step_reward"].transpose("pair", "side", "step")
    v = da.values.copy()
    for i in range(v.shape[0]):
        for s in range(v.shape[1]):
            n = int(np.isfinite(v[i, s]).sum())
            for k in range(n - 2, 0, -1):
                v[i, s, k] += 0.05 * v[i, s, k - 1]
    res["step_reward"] = da.copy(data=v).transpose(*res["step_reward"].dims)
    sm = res["step_margin"].transpose("pair", "step")
    w = sm.values.copy()
    m = v[:, 0] - v[:, 1]
    w[np.isfinite(w)] = m[np.isfinite(w)]
    res["step_margin"] = sm.copy(data=w).transpose(*res["step_margin"].dims)


def prm_margin_first_step(res):
    """step_margin: the first step's margin 4 % high (every other step, and the step rewards, kept)."""
    da = res["step_margin"].copy()
    da[dict(step=0)] = da.isel(step=0) * 1.04
    res["step_margin"] = da


def _per_token(res, fn, rows=slice(None)):
    da = res["per_token_reward"].transpose("pair", "side", "position")
    v = da.values.copy()
    for i in range(v.shape[0])[rows]:
        for s in range(2):
            n = int(np.isfinite(v[i, s]).sum())
            if n > 2:
                v[i, s, :n] = fn(v[i, s, :n])
    res["per_token_reward"] = da.copy(data=v).transpose(*res["per_token_reward"].dims)


def implicit_smoothed(res):
    """per-token reward smoothed (0.25, 0.5, 0.25 with the ends repeated), each side's sum kept."""
    def smooth(r):
        p = np.r_[r[0], r, r[-1]]
        out = 0.25 * p[:-2] + 0.5 * p[1:-1] + 0.25 * p[2:]
        out[-1] += r.sum() - out.sum()
        return out
    _per_token(res, smooth)


def implicit_shift_half(res):
    """per-token reward one position late on every other pair (the first takes the last's; sums kept)."""
    _per_token(res, lambda r: np.roll(r, 1), slice(None, None, 2))


def ensemble_member_swap(res):
    """member_margin: two members' margins swapped on one pair (their sum kept)."""
    da = res["member_margin"].transpose("pair", "member")
    v = da.values.copy()
    v[0, [0, 1]] = v[0, [1, 0]]
    res["member_margin"] = da.copy(data=v).transpose(*res["member_margin"].dims)


def leace_both_4pct(res):
    """LEACE displacements of the planted and the unplanted concept both 4 % low (their ratio kept)."""
    res["displacement"] = res["displacement"] * 0.96
    res["unplanted_displacement"] = res["unplanted_displacement"] * 0.96


def curvature_4pct(res):
    """margin Hessian eigenvalues 4 % high (the Rayleigh ratio stays above 0.9)."""
    res["margin_eigenvalues"] = res["margin_eigenvalues"] * 1.04


def steer_both_4pct(res):
    """steering slopes along the fitted direction and along w_r both 4 % high (their ratio kept)."""
    res["steer_slope"] = res["steer_slope"] * 1.04
    res["steer_slope_head"] = res["steer_slope_head"] * 1.04


def attribution_mlp_4pct(res):
    """attribution patch effect of the mlp components 4 % high."""
    da = res["attribution_patch_effect"].copy()
    da.loc[dict(component="mlp")] = da.sel(component="mlp") * 1.04
    res["attribution_patch_effect"] = da


def path_move_4pct(res):
    """path patching: 4 % of every direct path booked as indirect (direct + indirect kept)."""
    da = res["path_patch_effect"].copy()
    d = da.sel(path="direct").values.copy()
    da.loc[dict(path="direct")] = 0.96 * d
    da.loc[dict(path="indirect")] = da.sel(path="indirect").values + 0.04 * d
    res["path_patch_effect"] = da


def null_4pct(res):
    """null test: the observed effect and every null draw 4 % high (p-values kept)."""
    res["observed_effect"] = res["observed_effect"] * 1.04
    res["null_draws"] = res["null_draws"] * 1.04


def group_dz_4pct(res):
    """effect size d_z of every group 4 % high (estimate and interval)."""
    res["effect_size_by_dimension"] = res["effect_size_by_dimension"] * 1.04


def scalar_cost_weighted_4pct(res):
    """scalar cost: the margin-weighted sign disagreement 4 % high (the plain share the floor reads kept)."""
    da = res["scalar_cost"].copy()
    da.loc[dict(scalar_cost_statistic="sign_disagreement_weighted")] = \
        da.sel(scalar_cost_statistic="sign_disagreement_weighted") * 1.04
    res["scalar_cost"] = da


@dataclass(frozen=True)
class Forgery:
    name: str
    kind: str
    argv: tuple                  # calibrate arguments (observable=..., organism=..., n_pairs=...)
    edit: object = None          # outputs edit (above), or None
    what: str = ""
    quantile_shift: bool = False  # build the ensemble with its quantile one member off


FORGERIES = (
    Forgery("lens_lag_half", "classifier lens", ("observable=lens", "n_pairs=6"), lens_lag_half),
    Forgery("dla_mlp_4pct", "classifier DLA", ("observable=dla", "n_pairs=6"), dla_mlp_4pct),
    Forgery("patch_swap_l1", "classifier patch", ("observable=patch", "n_pairs=6"), patch_swap_l1),
    Forgery("attribution_mlp_4pct", "classifier attribution", ("observable=attribution_patch", "n_pairs=6"),
            attribution_mlp_4pct),
    Forgery("path_move_4pct", "classifier path patch", ("observable=examples/path_patch", "organism=planted_paths",
                                                        "n_pairs=6"), path_move_4pct),
    Forgery("steer_both_4pct", "steering", ("observable=examples/steer_dose_response", "n_pairs=6"), steer_both_4pct),
    Forgery("null_4pct", "null test", ("observable=examples/null_mlp_effect", "n_pairs=8"), null_4pct),
    Forgery("group_dz_4pct", "group statistics", ("observable=examples/accuracy_by_dimension",
                                                  "organism=trained_length"), group_dz_4pct),
    Forgery("judge_half_4pct", "judge", ("observable=score", "organism=judge_planted", "n_pairs=4"), judge_half_4pct),
    Forgery("prm_leak", "PRM", ("observable=prm_steps", "organism=prm_planted", "n_pairs=4"), prm_leak),
    Forgery("prm_margin_first_step", "PRM", ("observable=prm_steps", "organism=prm_planted", "n_pairs=4"),
            prm_margin_first_step),
    Forgery("implicit_smoothed", "implicit per-token", ("observable=implicit", "organism=implicit_planted",
                                                        "n_pairs=4"), implicit_smoothed),
    Forgery("implicit_shift_half", "implicit per-token", ("observable=implicit", "organism=implicit_planted",
                                                          "n_pairs=4"), implicit_shift_half),
    Forgery("ensemble_quantile_one_member", "ensemble", ("observable=ensemble", "organism=ensemble_planted",
                                                         "n_pairs=6"), None,
            "the ensemble reduces with q = 0.75 where it declares 0.25 (one member up)", True),
    Forgery("ensemble_member_swap", "ensemble", ("observable=ensemble", "organism=ensemble_planted", "n_pairs=6"),
            ensemble_member_swap),
    Forgery("leace_both_4pct", "LEACE", ("observable=LEACE", "organism=concept", "n_pairs=200"), leace_both_4pct),
    Forgery("curvature_4pct", "curvature", ("observable=examples/curvature", "organism=curvature", "n_pairs=2"),
            curvature_4pct),
    Forgery("scalar_cost_weighted_4pct", "scalar cost", ("observable=scalar_cost", "organism=multi_objective"),
            scalar_cost_weighted_4pct),
)


@contextlib.contextmanager
def forged(f: Forgery):
    """``run.executor.compute`` returning ``f.edit``'s outputs, or the ensemble organism built off by one member."""
    from reward_lens_spec.kinds.ensemble import organism as eo
    from reward_lens_spec.run import executor
    real_compute, real_org = executor.compute, eo.ensemble_organism

    def compute(*a, **kw):
        res, ctx, enc = real_compute(*a, **kw)
        if f.edit is not None:
            res = dict(res)
            f.edit(res)
        return res, ctx, enc

    def organism(*a, **kw):
        org = real_org(*a, **kw)
        return replace(org, lm=replace(org.lm, q=org.lm.q + 1.0 / (len(org.lm.members) - 1)))
    executor.compute = compute
    if f.quantile_shift:
        eo.ensemble_organism = organism
    try:
        yield
    finally:
        executor.compute, eo.ensemble_organism = real_compute, real_org


def run_one(f: Forgery, store: str, leace_path: str) -> dict:
    """Calibrate under forgery ``f``; the stored card's verdict, failing criteria and reason."""
    from reward_lens_spec.trust.cli import calibrate_main
    from reward_lens_spec.trust.evidence import card_verdict, identities_ok
    from reward_lens_spec.trust.scorecard import find_cards
    argv = [a.replace("observable=LEACE", f"observable={leace_path}") for a in f.argv] + [f"store.url={store}"]
    before = len(find_cards(store))
    out, t0 = io.StringIO(), time.perf_counter()
    with forged(f), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = calibrate_main(argv)
    cards = find_cards(store)
    if len(cards) == before:
        return {"card": "none", "failing": "-", "why": out.getvalue().strip().splitlines()[-1:], "rc": rc,
                "s": time.perf_counter() - t0}
    card = cards[-1]
    ok, why = card_verdict(card, check_code=False)      # the forged code stands for the code under test
    failing = [c for c, v in (card.get("criteria_passed") or {}).items() if not v]
    if len(failing) > 1:                                 # each failing criterion's own reason
        why = "; ".join(card_verdict({**card, "readings": {c: card["readings"][c]}, "identities": []},
                                     check_code=False)[1] for c in failing)
    if any(not identities_ok(per)[0] for per in card.get("identities") or ()):
        failing.append("identity")
    return {"card": "PASS" if ok else "FAIL", "failing": ", ".join(failing) or "-", "why": why, "rc": rc,
            "s": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="forgery names to run (default: all)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    chosen = [f for f in FORGERIES if a.only is None or f.name in a.only]
    tmp = Path(tempfile.mkdtemp(prefix="forgeries-"))
    leace = tmp / "leace_concept.yaml"
    leace.write_text(LEACE_YAML)
    rows = []
    for f in chosen:
        r = run_one(f, str(tmp / f"{f.name}.zarr"), str(leace))     # a store each: a card id repeats
        what = " ".join((f.what or f.edit.__doc__ or "").split())
        rows.append((f.name, f.kind, what, r))
        print(f"{f.name:<30} {f.kind:<24} {r['card']:<5} {r['failing']:<40} {r['s']:6.1f}s  {r['why']}",
              file=sys.stderr, flush=True)
    if a.markdown:
        print("| forgery | kind | what was forged | card | failing criterion | reason |")
        print("|---|---|---|---|---|---|")
        for name, kind, what, r in rows:
            why = str(r["why"]).replace("|", "\\|")
            print(f"| `{name}` | {kind} | {what} | {r['card']} | {r['failing']} | {why} |")
    else:
        for name, kind, what, r in rows:
            print(f"{name:<30} {kind:<24} {r['card']:<5} {r['failing']}")
    return 1 if any(r["card"] != "FAIL" for *_, r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
