"""Which outputs a scorecard can grade, and why the others cannot be: every output variable of every shipped
observable (``conf/observable/**``) and of ``drift`` is either read by a criterion (``registries.CRITERIA``,
by name, on the organism kinds the criterion names) or has a reason here (``WHY_NOT``), which a card stores
(``Scorecard.why_not``) and prints beside each ungraded output. ``tests/test_calibration_coverage.py`` fails on an
output in neither set. An ungraded output keeps a run ``exploratory`` for that variable (``trust.evidence_chain``).
"""
from __future__ import annotations

from ..registries import CRITERIA

_FN_OF_MARGIN = ("a fixed function of `margin` ({}); its truth would be that function of the planted margin, but no "
                 "criterion reads it yet, so a wrong value here is not caught")
_NO_PLANT = "no organism plants a value for it: {}"
_RESAMPLED = "a resampling statistic (bootstrap/permutation/null draws): its truth is a distribution, not a planted value"

WHY_NOT = {
    # Bradley–Terry readouts of the margin
    "p_chosen": _FN_OF_MARGIN.format("σ(Δ)"),
    "bt_loss": _FN_OF_MARGIN.format("softplus(−Δ), nats"),
    "bt_grad": _FN_OF_MARGIN.format("−σ(−Δ)"),
    # ArmoRM / multi-objective heads
    "objective_rewards": _NO_PLANT.format("no gated multi-objective organism exists"),
    "gate_weights": _NO_PLANT.format("no gated multi-objective organism exists"),
    "objective_margin": _NO_PLANT.format("the multi_objective organism's truth is a participation ratio, not per-pair "
                                         "objective margins"),
    "objective_cosine": _NO_PLANT.format("no organism plants objective directions"),
    "objective_cosine_whitened": _NO_PLANT.format("no organism plants objective directions"),
    "objective_conflict": _NO_PLANT.format("no organism plants objective directions"),
    "objective_margin_correlation": _NO_PLANT.format("no organism plants objective directions"),
    # restored fractions and pooled faithfulness: ratios of graded cells
    "patch_restored": "a ratio effect / (r_source − r_base) of the graded patch_effect cells; its kept cells are checked "
                      "against a plain forward (reference_identities) but no criterion grades the ratio",
    "attribution_patch_restored": "a ratio of the graded attribution_patch_effect to the margin; first-order, no "
                                  "planted value for the ratio",
    "faithfulness": _NO_PLANT.format("agreement of DLA and patching per unit; both inputs are graded"),
    "faithfulness_pooled": _NO_PLANT.format("agreement of DLA and patching pooled; both inputs are graded"),
    "dla_heads": "a head grid under another name: dla_share reads a head grid only as the output named dla, on the "
                 "planted_head organism; under this name no criterion reads it",
    # lens variants
    "lens_raw": "the un-normed lens: its kept cells are checked against a plain forward (reference_identities), but no "
                "organism plants a raw-lens value",
    "crystallization_fraction": _NO_PLANT.format("the planted layer is graded through crystallization_layer; the "
                                                 "fraction of depth is a per-pair summary of it"),
    "lens_by_dimension": _NO_PLANT.format("the organisms plant no per-dimension depth"),
    "margin_share": _NO_PLANT.format("a share of |DLA| per component type; the planted unit is graded by dla_share"),
    # confounders
    **{k: _NO_PLANT.format("no organism plants a length, overlap or position confound with a known size")
       for k in ("length_log_ratio", "length_confound", "overlap_diff", "support_confound", "chosen_position",
                 "order_confound", "swap_residual", "order_bias")},
    # preference structure
    "contested_direction_stats": _RESAMPLED,
    "hodge_by_group": _NO_PLANT.format("planted_cycle plants cycles in the pooled labels; per group they are not "
                                       "planted"),
    "skew_singular_values": _NO_PLANT.format("planted_cycle's truth is the cyclic gain, not the spectrum"),
    "contested_margin_80": _NO_PLANT.format("an example variant of contested_margin at 80% agreement, graded as "
                                            "contested_margin under that name only"),
    "cyclic_gain_rank2": _NO_PLANT.format("an example variant of preference_rank at rank 2; graded as preference_rank "
                                          "under that name only"),
    "label_cycles": _NO_PLANT.format("an example variant of hodge_pooled under another name; graded as hodge_pooled"),
    "gated_scalar_cost": _NO_PLANT.format("an example variant of scalar_cost on a gated head; no gated organism"),
    # interventions as artifacts: the fitted LEACE eraser's parameters (the erasure itself is graded by leace_removal)
    "eraser_mean": _NO_PLANT.format("the eraser's mean μ is a fit statistic; its erasure is graded as leace_removal"),
    "eraser_projection": _NO_PLANT.format("the eraser's matrix E is a fit; its erasure is graded as leace_removal"),
    # TRL stepwise data: the model's step rewards graded against the data's own labels (not a planted organism)
    **{k: _NO_PLANT.format("a grade of the model against the dataset's per-step labels; no organism plants labels")
       for k in ("step_label", "first_error", "step_accuracy", "step_auc", "first_error_accuracy")},
    # SAE fit on this model: a measurement of the dictionary, gated by trust.sae_gate's floor
    **{k: _NO_PLANT.format("the SAE's reconstruction of this model's activations; it gates the attribution "
                           "(trust.sae_gate) rather than being graded")
       for k in ("sae_variance_explained", "sae_relative_error")},
    # ensembles
    "member_sign_agreement": _NO_PLANT.format("the ensemble organism plants its members' rewards (graded by "
                                              "ensemble_member_margin); the agreement share follows from them but no "
                                              "criterion reads it yet"),
    "member_rank_correlation": _NO_PLANT.format("as member_sign_agreement: a function of the graded member margins, "
                                                "not yet read by a criterion"),
    # ablation, rescue, steering, patch variants
    "rescued_effect": "graded by the rescue tests against planted fractions (tests/test_rescue.py), not by a card: "
                      "no organism kind carries the restored part as truth",
    "rescue_fraction": "as rescued_effect: planted fractions are tested, not card-graded",
    "steer_margin": _NO_PLANT.format("the dose–response curve; its slope is graded by steer_alignment"),
    "steer_margin_response": _NO_PLANT.format("the response curve; slopes are graded by steer_alignment"),
    "steer_margin_readout": _NO_PLANT.format("the response at the readout; slopes are graded by steer_alignment"),
    "late_mlp_effect": "a patch grid restricted to late MLPs under another name; graded as patch_effect under that "
                       "name only",
    "late_mlp_effect_total": _NO_PLANT.format("a sum over late MLP cells"),
    # implicit reward instruments
    "implicit_lens_sides": _NO_PLANT.format("implicit_planted plants a per-token unembedding bias, not a depth"),
    "implicit_lens": _NO_PLANT.format("implicit_planted plants a per-token unembedding bias, not a depth"),
    "implicit_patch_effect": _NO_PLANT.format("implicit_planted plants no unit"),
    "implicit_patch_fraction": _NO_PLANT.format("implicit_planted plants no unit; the fraction is refused where policy "
                                                "and reference differ in their readout"),
    "implicit_attribution_patch_effect": _NO_PLANT.format("implicit_planted plants no unit"),
    # benchmarks
    **{k: "a benchmark score over labelled data: its truth is the benchmark's labels, not a planted organism value"
       for k in ("subset_accuracy", "section_accuracy", "rewardbench_score", "candidate_reward", "best_of_n_correct",
                 "best_of_n_accuracy", "ties_score")},
    # PRM aggregates
    "aggregate": "checked every cell by an identity (aggregate = the declared rule over σ(step rewards), trust."
                 "identities), whose step rewards prm_step_reward grades; no separate criterion",
    "aggregate_margin": "as aggregate: an identity over the graded step rewards",
    # prefix rewards
    "prefix_reward": _NO_PLANT.format("no organism plants a reward per response prefix"),
    "prefix_margin": _NO_PLANT.format("no organism plants a margin per response prefix"),
    "prefix_lens": _NO_PLANT.format("no organism plants a lens per response prefix"),
    # representation
    "h": "activations in the model's native basis: no planted value; the identities check the reward read from them",
    "w_r": "the head's own weights, read directly (no estimate to calibrate)",
    "margin_direction": _NO_PLANT.format("a mean activation difference in the native basis"),
    "margin_change": _NO_PLANT.format("the margin change under erasure; the concept organism grades erasure through "
                                      "certificate and displacement"),
    "margin_change_ci": _RESAMPLED,
    "effective_dimension": "graded against a dense Hessian by tests/test_curvature.py, not by a card: the curvature "
                           "organism plants a direction (curvature_direction), not a dimension",
    "effective_dimension_se": "a standard error over probes (jackknife): no planted value",
    "spectral_density": _NO_PLANT.format("the curvature organism plants a direction, not a density"),
    "sae_top": "a ranking of sae_contribution, which sae_contribution grades cell by cell; no criterion reads the "
               "ranking itself",
    # drift (compare.drift); mean_margin, accuracy, cka, procrustes_residual, margin_spearman: drift card criteria
    "margin_spearman_ci_low": _RESAMPLED,
    "margin_spearman_ci_high": _RESAMPLED,
    "w_r_cosine": _NO_PLANT.format("a cosine in a frame fitted from the same activations; the training organism "
                                   "plants a step, not a direction"),
    "margin_direction_cosine": _NO_PLANT.format("as w_r_cosine"),
    **{k: _RESAMPLED for k in ("w_r_null_q95", "w_r_p_value", "margin_direction_null_q95", "margin_direction_p_value")},
    "frame_underdetermined": "a flag (rows ≤ d_model), not an estimate",
}


def graded_by(name: str) -> list[tuple[str, tuple]]:
    """``[(criterion, organism kinds)]`` that read output ``name`` (kinds ``()``: any organism)."""
    return [(c.name, tuple(c.kinds)) for c in CRITERIA.values() if name in c.needs]


def why_not(name: str, kind: str | None = None) -> str:
    """Why a card on organism ``kind`` does not grade output ``name`` (one line)."""
    if name in WHY_NOT:
        return WHY_NOT[name]
    other = graded_by(name)
    if other:
        kinds = sorted({k for _, ks in other for k in ks}) or ["a planted unit"]
        return (f"graded by {', '.join(sorted({c for c, _ in other}))} on organism {', '.join(kinds)}, not on "
                f"{kind or 'this one'} (or only together with the outputs those criteria also need)")
    return "no criterion reads an output of this name and no reason is recorded (trust.coverage.WHY_NOT)"
