"""The SAE gate: an SAE attribution is kept exploratory unless its SAE reconstructs THIS model's activations.

SAEs are trained on base language models and attached to fine-tuned ones (SAELens #436, #469); one that
does not reconstruct the reward model's activations gives plausible but wrong features. A run of
``sae_attribution`` that also measures ``variance_explained`` (``ops.sae_attribution.reconstruction``) with
the same SAE at the same site records it, sealed, in the run attr ``sae`` (``sae_record``):
``{"fits": {"<digest>@<site>": {variance_explained, relative_error, base_model}}, "outputs": {variable:
"<digest>@<site>"}}``. On every read (``trust.evidence_chain``), each attribution output whose SAE's variance
explained at that site is below ``MIN_VARIANCE_EXPLAINED`` — or was not measured — derives ``exploratory``,
with the reason (``sae_caps``); the floor is this package's, never the stored one.

Floor: ``MIN_VARIANCE_EXPLAINED = 0.7`` — the SAE must explain at least 70 % of the variance of the
activations it decomposes here (fraction of variance unexplained ≤ 0.3; Gao et al. 2024 report FVU well
below that for the SAEs they trust). No torch import.
"""
from __future__ import annotations

import math

MIN_VARIANCE_EXPLAINED = 0.7
FIT = ("variance_explained", "relative_error")


def sae_record(result) -> dict | None:
    """The ``sae`` run attr of a result (variables with an ``sae`` attr: ``ops.sae_attribution``), or None."""
    fits: dict = {}
    outputs: dict = {}
    for v in result.data_vars:
        a = result[v].attrs
        if "sae" not in a:
            continue
        key = f"{a['sae']}@{a.get('site')}"
        if a.get("quantity") in FIT:
            rec = fits.setdefault(key, {"base_model": a.get("sae_base_model")})
            value = float(result[v].values)
            rec[a["quantity"]] = value if math.isfinite(value) else None
        else:
            outputs[str(v)] = key
    return {"fits": fits, "outputs": outputs} if outputs or fits else None


def sae_caps(attrs: dict) -> dict[str, str]:
    """Variable → why it stays exploratory, for each SAE attribution output of a run whose SAE explains less
    than ``MIN_VARIANCE_EXPLAINED`` of this model's activations at its site, or was not measured there."""
    rec = attrs.get("sae") if isinstance(attrs.get("sae"), dict) else None
    if not rec:
        return {}
    out = {}
    for var, key in (rec.get("outputs") or {}).items():
        fit = (rec.get("fits") or {}).get(key)
        digest, _, site = str(key).partition("@")
        if fit is None or fit.get("variance_explained") is None:
            out[var] = (f"SAE {digest[:12]} at {site}: its reconstruction of this model's activations was not "
                        "measured (add a step with quantity: variance_explained)")
            continue
        ve = fit["variance_explained"]
        if not ve >= MIN_VARIANCE_EXPLAINED:
            out[var] = (f"SAE {digest[:12]} (trained on {fit.get('base_model')}) explains {ve:.3f} of the variance "
                        f"of this model's activations at {site}, below the floor {MIN_VARIANCE_EXPLAINED} (relative "
                        f"reconstruction error {fit.get('relative_error')})")
    return out
