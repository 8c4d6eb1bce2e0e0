"""An SAE from another model on this reward model (issue 41 item 3): ``base_model`` recorded, the SAE's variance
explained and relative reconstruction error on this model's activations stored per run and checked against a
naive computation, and an SAE that does not reconstruct this model leaves the attribution exploratory with
that reason (``trust.sae_gate``)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from reward_lens_spec import open_store
from reward_lens_spec.errors import SpecError
from reward_lens_spec.engine.sae import load_sae, save_sae, train_sae
from reward_lens_spec.run import compose_run, execute
from reward_lens_spec.trust.sae_gate import MIN_VARIANCE_EXPLAINED

pytestmark = pytest.mark.usefixtures("one_thread")
CAPTURE = "name: h_only\nsteps:\n  - {name: h, op: capture, site: readout}\noutputs: [h]\n"


def _run(tmp_path, obs_text, *over, url="s.zarr"):
    (tmp_path / "obs.yaml").write_text(obs_text)
    run, y = compose_run([f"observable={tmp_path / 'obs.yaml'}", "dataset.limit=16", *over])
    return execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / url), progress=False)


def _attribution(path, digest, base_model=None):
    extra = f", base_model: {base_model}" if base_model else ""
    common = f"path: {path}, digest: {digest}{extra}"
    return ("name: sae_base\nsteps:\n"
            f"  - {{name: sae_contribution, op: sae_attribution, quantity: contribution, {common}}}\n"
            f"  - {{name: sae_ve, op: sae_attribution, quantity: variance_explained, {common}}}\n"
            f"  - {{name: sae_rel, op: sae_attribution, quantity: relative_error, {common}}}\n"
            "outputs: [sae_contribution, sae_ve, sae_rel]\n")


def naive_fit(sae, h):
    """Variance explained and relative error written out row by row (no vectorised path of the package)."""
    W_enc, b_enc, W_dec, b_dec = (np.asarray(a, np.float64) for a in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec))
    rows = np.asarray(h, np.float64).reshape(-1, h.shape[-1])
    mean = sum(rows) / len(rows)
    sse = sst = ssn = 0.0
    for x in rows:
        z = np.maximum(W_enc.T @ (x - b_dec) + b_enc, 0.0)
        keep = np.argsort(-z, kind="stable")[:sae.k]
        f = np.zeros_like(z)
        f[keep] = z[keep]
        e = x - (f @ W_dec + b_dec)
        sse += float(e @ e)
        sst += float((x - mean) @ (x - mean))
        ssn += float(x @ x)
    return 1 - sse / sst, (sse / ssn) ** 0.5


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A TopK SAE trained on model tiny's readout activations (the 'base model'), saved in SAE-Lens format."""
    tmp = tmp_path_factory.mktemp("sae_base")
    h = _run(tmp, CAPTURE).result["h"].transpose("pair", "side", "d_model").values
    sae, _ = train_sae(lambda: iter([h.reshape(-1, h.shape[-1])]), h.shape[-1], 32, 8, epochs=60, lr=0.01,
                       batch=16, seed=0)
    sae.metadata["model_name"] = "tiny"
    save_sae(sae, tmp / "sae")
    return tmp / "sae", load_sae(tmp / "sae")


def test_an_sae_on_the_model_it_was_trained_on_reconstructs_it_and_matches_a_naive_computation(tmp_path, planted):
    folder, sae = planted
    out = _run(tmp_path, _attribution(folder, sae.digest()))
    r = out.result
    h = _run(tmp_path, CAPTURE, url="h.zarr").result["h"].transpose("pair", "side", "d_model").values
    ve, rel = naive_fit(sae, h)
    assert float(r["sae_ve"]) == pytest.approx(ve, abs=1e-9) and float(r["sae_rel"]) == pytest.approx(rel, abs=1e-9)
    assert ve >= MIN_VARIANCE_EXPLAINED                              # the planted SAE does reconstruct its model
    for v in r.data_vars:
        assert r[v].attrs["sae_base_model"] == "tiny" and r[v].attrs["sae"] == sae.digest()
    attrs = open_store(str(tmp_path / "s.zarr")).provenance(out.run_id)
    key = f"{sae.digest()}@readout"
    assert attrs["sae"]["outputs"] == {"sae_contribution": key}
    assert attrs["sae"]["fits"][key]["variance_explained"] == pytest.approx(ve, abs=1e-9)
    assert "below the floor" not in open_store(str(tmp_path / "s.zarr")).trust(out.run_id)["trust_reason"]


def test_the_same_sae_on_another_model_falls_below_the_floor_and_the_attribution_stays_exploratory(tmp_path, planted):
    folder, sae = planted
    other = ["model.seed=7", "model.name=tiny_seed7"]                # the same architecture, other weights
    out = _run(tmp_path, _attribution(folder, sae.digest()), *other)
    h = _run(tmp_path, CAPTURE, *other, url="h.zarr").result["h"].transpose("pair", "side", "d_model").values
    ve, rel = naive_fit(sae, h)
    assert float(out.result["sae_ve"]) == pytest.approx(ve, abs=1e-9) and ve < MIN_VARIANCE_EXPLAINED
    assert float(out.result["sae_rel"]) == pytest.approx(rel, abs=1e-9)
    st = open_store(str(tmp_path / "s.zarr"))
    verdict = st.trust(out.run_id)
    assert verdict["trust_by_variable"]["sae_contribution"] == "exploratory" and verdict["trust_verified"]
    assert f"explains {ve:.3f}" in verdict["trust_reason"] and "below the floor 0.7" in verdict["trust_reason"]
    assert "trained on tiny" in verdict["trust_reason"]
    # tamper: the stored fit edited to pass the floor breaks the seal; the run reads exploratory, unverified
    from reward_lens_spec.store import Backend
    b = Backend(str(tmp_path / "s.zarr"))
    doc = f"{b.root}/runs/{out.run_id}/zarr.json"
    meta = json.loads(b.fs.cat_file(doc))
    key = f"{sae.digest()}@readout"
    meta["attributes"]["sae"]["fits"][key]["variance_explained"] = 0.99
    b.fs.pipe_file(doc, json.dumps(meta).encode())
    again = open_store(str(tmp_path / "s.zarr")).trust(out.run_id)
    assert again["trust"] == "exploratory" and not again["trust_verified"]


def test_a_declared_base_model_that_contradicts_the_sae_folder_is_refused(tmp_path, planted):
    folder, sae = planted
    with pytest.raises(SpecError, match="base_model") as e:
        _run(tmp_path, _attribution(folder, sae.digest(), base_model="gpt2"))
    assert "trained on 'tiny'" in str(e.value) and "Fix:" in str(e.value)


def test_the_fit_is_refused_at_a_site_whose_activations_are_not_kept(tmp_path):
    obs = ("name: x\nsteps:\n  - {name: v, op: sae_attribution, quantity: variance_explained, site: resid_post, "
           "layer: 0}\noutputs: [v]\n")
    with pytest.raises(SpecError, match="site: readout"):
        _run(tmp_path, obs)


def test_the_gate_reads_the_stored_fit_against_this_packages_floor_and_names_the_reason():
    """``sae_caps`` on sealed-attr shapes: above the floor no cap; below, or not measured, a one-line reason."""
    from reward_lens_spec.ops.sae_attribution import reconstruction
    from reward_lens_spec.trust.sae_gate import sae_caps
    from tests.test_sae import random_sae
    sae = random_sae(d_in=8, d_sae=6, k=2)
    h = np.random.default_rng(3).normal(size=(5, 2, 8))
    fit = reconstruction(sae, h)
    assert (fit["variance_explained"], fit["relative_error"]) == pytest.approx(naive_fit(sae, h), abs=1e-12)
    key = "d" * 64 + "@readout"
    attrs = {"sae": {"outputs": {"c": key}, "fits": {key: {"variance_explained": MIN_VARIANCE_EXPLAINED,
                                                           "relative_error": 0.2, "base_model": "base"}}}}
    assert sae_caps(attrs) == {}                                                # at the floor: passes
    attrs["sae"]["fits"][key]["variance_explained"] = MIN_VARIANCE_EXPLAINED - 1e-9
    assert "below the floor" in sae_caps(attrs)["c"] and "trained on base" in sae_caps(attrs)["c"]
    attrs["sae"]["fits"] = {}
    assert "not measured" in sae_caps(attrs)["c"]
