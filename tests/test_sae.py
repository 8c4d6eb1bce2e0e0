"""Sparse features (issue 29 items 5–6): a TopK SAE, SAE-Lens' format, streamed training, the exact margin
decomposition over features vs a plain forward, feature patching vs a hooked forward, a planted feature."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.engine.sae import TopKSAE, load_sae, rows_of, save_sae, train_sae
from reward_lens_spec.spec import ObservableSpec

pytestmark = pytest.mark.usefixtures("one_thread")


def random_sae(d_in=64, d_sae=24, k=4, seed=0) -> TopKSAE:
    rng = np.random.default_rng(seed)
    D = rng.normal(size=(d_sae, d_in))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    return TopKSAE((D.T * 1.3).astype(np.float32), rng.normal(size=d_sae).astype(np.float32) * 0.1,
                   D.astype(np.float32), rng.normal(size=d_in).astype(np.float32) * 0.1, k)


def naive_encode(sae, h):
    """f(h) = TopK(ReLU(W_enc·(h − b_dec) + b_enc)) written out row by row."""
    W_enc, b_enc, b_dec = (np.asarray(a, np.float64) for a in (sae.W_enc, sae.b_enc, sae.b_dec))
    out = []
    for x in np.atleast_2d(np.asarray(h, np.float64)):
        z = np.maximum(W_enc.T @ (x - b_dec) + b_enc, 0.0)
        keep = np.argsort(-z, kind="stable")[:sae.k]
        f = np.zeros_like(z)
        f[keep] = z[keep]
        out.append(f)
    return np.array(out)


# -- the SAE itself -----------------------------------------------------------------------------------------
def test_sae_lens_format_round_trips_with_the_documented_keys_and_shapes(tmp_path):
    from safetensors.numpy import load_file
    sae = random_sae()
    save_sae(sae, tmp_path / "sae")
    raw, cfg = load_file(str(tmp_path / "sae" / "sae_weights.safetensors")), json.loads(
        (tmp_path / "sae" / "cfg.json").read_text())
    assert {n: raw[n].shape for n in raw} == {"W_enc": (64, 24), "b_enc": (24,), "W_dec": (24, 64), "b_dec": (64,)}
    assert (cfg["architecture"], cfg["d_in"], cfg["d_sae"], cfg["k"]) == ("topk", 64, 24, 4)
    back = load_sae(tmp_path / "sae")
    for n in ("W_enc", "b_enc", "W_dec", "b_dec"):
        np.testing.assert_array_equal(getattr(back, n), getattr(sae, n))
    assert back.digest() == sae.digest()
    # an older SAE-Lens cfg (activation_fn_str topk + activation_fn_kwargs) reads too
    old = {k: v for k, v in cfg.items() if k not in ("architecture", "k")}
    (tmp_path / "sae" / "cfg.json").write_text(json.dumps({**old, "activation_fn_str": "topk",
                                                           "activation_fn_kwargs": {"k": 4}}))
    assert load_sae(tmp_path / "sae").k == 4


@pytest.mark.parametrize("edit, match", [
    ({"architecture": "standard", "k": None}, "TopK"),
    ({"d_in": 32}, "shape"),
    ({"normalize_activations": "expected_average_only_in"}, "normaliz"),
])
def test_a_bad_sae_folder_is_refused_naming_the_field(tmp_path, edit, match):
    save_sae(random_sae(), tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(SpecError, match=match) as e:
        load_sae(tmp_path, "observable.steps.path")
    assert "observable.steps.path" in str(e.value)
    with pytest.raises(SpecError, match="cfg.json"):
        load_sae(tmp_path / "nowhere", "observable.steps.path")


def test_topk_encoding_is_sparse_and_the_reconstruction_identity_is_exact():
    sae = random_sae()
    h = np.random.default_rng(1).normal(size=(50, 64)) * 3
    f = sae.encode(h)
    assert ((f > 0).sum(1) <= sae.k).all() and ((f > 0).sum(1) == sae.k).mean() > 0.9 and (f >= 0).all()
    np.testing.assert_allclose(f, naive_encode(sae, h), atol=1e-12)
    # h = Σ_i f_i d_i + b_dec + e, with d_i the decoder rows, written as a plain sum
    recon = sum(f[:, [i]] * np.asarray(sae.W_dec[i], np.float64) for i in range(sae.d_sae)) + sae.b_dec
    np.testing.assert_allclose(recon + sae.error(h), h, atol=1e-12)


class Tracked:
    """A sliceable array that records how many rows each read materializes (a stand-in for a lazy store)."""

    def __init__(self, a):
        self.a, self.reads = a, []
        self.shape = a.shape

    def __getitem__(self, s):
        out = self.a[s]
        self.reads.append(out.shape[0])
        return out


def test_streamed_training_reads_one_chunk_at_a_time_is_seeded_and_learns_a_planted_dictionary():
    rng = np.random.default_rng(0)
    D = np.linalg.qr(rng.normal(size=(16, 12)))[0].T                       # 12 orthonormal atoms in 16 dims
    F = np.where(rng.random((300, 2, 12)) < 0.15, rng.uniform(1, 2, (300, 2, 12)), 0.0)
    X = Tracked((F @ D).astype(np.float32))                                  # pair × side × d
    sae, stats = train_sae(rows_of(X, 50), 16, 12, 4, epochs=30, lr=0.01, seed=3)
    assert max(X.reads) == 50 and sum(X.reads) == 300 * 30                  # never more than one chunk held
    assert stats["rows"] == 600 and stats["fvu"] < 0.05, stats
    cos = np.abs(np.asarray(sae.W_dec, np.float64) @ D.T)                   # feature × atom
    assert (cos.max(0) > 0.9).sum() >= 10, np.round(cos.max(0), 2)          # most atoms found
    again, _ = train_sae(rows_of(X, 50), 16, 12, 4, epochs=30, lr=0.01, seed=3)
    np.testing.assert_array_equal(again.W_dec, sae.W_dec)
    np.testing.assert_allclose(np.linalg.norm(sae.W_dec, axis=1), 1.0, atol=1e-5)   # unit-norm rows
    with pytest.raises(SpecError, match="d_in"):
        train_sae(rows_of(X, 50), 8, 12, 3, epochs=1)


# -- the operator through the one executor -------------------------------------------------------------------
def _compute(lm, steps, pairs=None, n_rerun=None):
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute
    from tests.conftest import make_pairs
    obs = ObservableSpec(name="sae", steps=steps, outputs=[s["name"] for s in steps])
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name, pairs=n_rerun)
    ds, ctx, _ = compute(lm, pairs or make_pairs(6), build_plan(obs, info), info, batch_size=4)
    return ds, ctx


def naive_readout(lm, ids):
    """(h at the last token from a plain forward's final norm, the model's own reward)."""
    got = {}
    hk = lm.model.model.norm.register_forward_hook(lambda m, a, o: got.__setitem__("h", o[0, -1].double().clone()))
    try:
        with torch.no_grad():
            r = float(lm.model(input_ids=torch.tensor([list(ids)])).logits[0, 0])
    finally:
        hk.remove()
    return got["h"].numpy(), r


def naive_reward_with(lm, ids, module, value):
    def hook(m, a, o):
        x = (o[0] if isinstance(o, tuple) else o).clone()
        x[0, -1] = torch.as_tensor(value, dtype=x.dtype)
        return (x,) + tuple(o[1:]) if isinstance(o, tuple) else x
    hk = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return float(lm.model(input_ids=torch.tensor([list(ids)])).logits[0, 0])
    finally:
        hk.remove()


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_llama")
    sae = random_sae(d_in=lm.d_model, k=5, seed=4)
    folder = save_sae(sae, tmp_path_factory.mktemp("sae"))
    kw = {"op": "sae_attribution", "path": str(folder), "digest": sae.digest()}
    steps = [{"name": q, "quantity": q, **kw} for q in ("contribution", "error", "activation_diff", "patch_effect")]
    steps += [{"name": "zeroed", "quantity": "patch_effect", "mode": "zero", **kw},
              {"name": "deep", "quantity": "patch_effect", "site": "resid_post", "layer": 1, **kw}]
    ds, ctx = _compute(lm, steps, n_rerun=3)
    return lm, load_sae(folder), ds, ctx


def test_feature_contributions_plus_the_error_term_sum_to_a_plain_forwards_margin(loaded):
    lm, sae, ds, ctx = loaded
    enc = ctx.encoded
    w = lm.model.score.weight[0].detach().double().numpy()
    assert ds["contribution"].dims == ("pair", "feature") and ds["error"].dims == ("pair",)
    for p in range(len(enc.pair_ids)):
        (hc, rc), (hr, rr) = naive_readout(lm, enc.chosen[p]), naive_readout(lm, enc.rejected[p])
        fc, fr = naive_encode(sae, hc)[0], naive_encode(sae, hr)[0]
        D = np.asarray(sae.W_dec, np.float64)
        want = [(fc[i] - fr[i]) * (w @ D[i]) for i in range(sae.d_sae)]
        ec, er = hc - (fc @ D + sae.b_dec), hr - (fr @ D + sae.b_dec)
        got = ds["contribution"].isel(pair=p).values
        np.testing.assert_allclose(got, want, atol=2e-5)
        assert abs(float(ds["error"].isel(pair=p)) - w @ (ec - er)) < 2e-5
        assert abs(got.sum() + float(ds["error"].isel(pair=p)) - (rc - rr)) < 5e-5 * (1 + abs(rc - rr))
        np.testing.assert_allclose(ds["activation_diff"].isel(pair=p).values, fc - fr, atol=2e-5)
    assert ds["contribution"].attrs["identity_residual"] < 1e-4
    assert ds["contribution"].attrs["units"] == "reward" and ds["contribution"].attrs["sae"] == sae.digest()
    assert (np.abs(ds["contribution"].values) > 1e-9).sum(1).max() <= 2 * sae.k     # sparse: ≤ k per side


def test_feature_patching_at_the_readout_equals_the_contribution_and_deeper_matches_a_hooked_forward(loaded):
    lm, sae, ds, ctx = loaded
    c = ds["contribution"].values[:3]
    np.testing.assert_allclose(ds["patch_effect"].values[:3], c, atol=5e-5)        # the head is linear in h
    np.testing.assert_allclose(ds["zeroed"].values[:3], -c, atol=5e-5)
    assert np.isnan(ds["patch_effect"].values[3:]).all()                             # observable.pairs = 3
    enc, D = ctx.encoded, np.asarray(sae.W_dec, np.float64)
    block = lm.model.model.layers[1]
    checked = 0
    for p in (0, 2):
        xs = []
        for ids in (enc.chosen[p], enc.rejected[p]):
            got = {}
            hk = block.register_forward_hook(lambda m, a, o: got.__setitem__("x", o[0][0, -1].double().clone()
                                                                           if isinstance(o, tuple) else o[0, -1].double().clone()))
            with torch.no_grad():
                lm.model(input_ids=torch.tensor([list(ids)]))
            hk.remove()
            xs.append(got["x"].numpy())
        fc, fr = naive_encode(sae, xs[0])[0], naive_encode(sae, xs[1])[0]
        base = naive_readout(lm, enc.rejected[p])[1]
        for i in np.flatnonzero(fc != fr)[:3]:
            want = naive_reward_with(lm, enc.rejected[p], block, xs[1] + (fc[i] - fr[i]) * D[i]) - base
            assert abs(float(ds["deep"].isel(pair=p, feature=i)) - want) < 5e-5, (p, i)
            checked += abs(want) > 1e-4
    assert checked >= 2

def test_plan_and_run_errors_name_the_field(tmp_path):
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_llama")
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    mk = lambda **kw: ObservableSpec(name="s", steps=[{"name": "s", "op": "sae_attribution", **kw}],  # noqa: E731
                                     outputs=["s"])
    for kw, field in (({"site": "resid_post", "layer": 1}, ".site"), ({"site": "resid_post"}, ".layer"),
                      ({"k": 40, "d_sae": 8}, ".k"), ({"quantity": "shapley"}, ".quantity"),
                      ({"train_on": "somewhere"}, ".train_on"), ({"epochs": 0}, ".epochs")):
        with pytest.raises(SpecError, match=field.strip(".")) as e:
            build_plan(mk(**kw), info)
        assert field in str(e.value), (kw, str(e.value))
    narrow = random_sae(d_in=32)
    save_sae(narrow, tmp_path)                                                     # the model's width is 64
    with pytest.raises(SpecError, match="d_in = 32") as e:
        _compute(lm, [{"name": "c", "op": "sae_attribution", "path": str(tmp_path), "digest": narrow.digest()}])
    assert "observable.steps.path" in str(e.value) and "train" in str(e.value)
    # a loaded SAE is pinned by its digest (so the run id covers its weights): missing or stale is refused
    with pytest.raises(SpecError, match="pinned") as e:
        build_plan(mk(path=str(tmp_path)), info)
    assert ".digest" in str(e.value) and f"digest: {narrow.digest()}" in str(e.value)
    save_sae(random_sae(d_in=32, seed=9), tmp_path)                               # retrained in place
    with pytest.raises(SpecError, match="changed") as e:
        build_plan(mk(path=str(tmp_path), digest=narrow.digest()), info)
    with pytest.raises(SpecError, match="no cfg.json"):
        build_plan(mk(path=str(tmp_path / "nowhere"), digest="x"), info)


# -- the planted sparse feature ------------------------------------------------------------------------------
def test_an_sae_trained_in_the_run_puts_the_top_attribution_on_the_planted_feature():
    from reward_lens_spec.organisms.sae_organism import sparse_feature_organism
    org = sparse_feature_organism()
    kw = {"op": "sae_attribution", "d_sae": 24, "k": 3, "epochs": 300, "seed": 0}
    ds, ctx = _compute(org.lm, [{"name": "c", **kw}, {"name": "a", "quantity": "activation_diff", **kw},
                                {"name": "e", "quantity": "error", **kw}], pairs=list(org.pairs))
    c = ds["c"].values
    r = org.lm.head.rewards(ctx.capture.h).astype(np.float64)
    np.testing.assert_allclose(c.sum(1) + ds["e"].values, r[:, 0, 0] - r[:, 1, 0], atol=1e-4)
    U = np.array(org.truth["atoms"])
    sae = next(v for k, v in ctx.memo.items() if k[0] == "sae")[0]
    cos = np.asarray(sae.W_dec, np.float64) @ U.T                                  # feature × atom
    share = np.abs(c).mean(0)
    top = int(np.argmax(share))
    assert abs(cos[top, 0]) > 0.95, np.round(cos[top], 2)                          # the planted atom u_0
    # a non-planted feature: the one aligned with another atom that differs most between the sides
    other = np.flatnonzero(np.abs(cos[:, 1:]).max(1) > 0.9)
    j = other[np.argmax(np.abs(ds["a"].values).mean(0)[other])]
    assert np.abs(ds["a"].values[:, j]).mean() > np.abs(ds["a"].values[:, top]).mean()   # it moves more …
    assert share[j] < 0.5 * share[top], (share[j], share[top])                     # … but carries less margin


def test_top_features_per_dimension_match_a_pandas_groupby():
    import pandas as pd
    import xarray as xr
    from reward_lens_spec.ops.top_features import TopFeatures, TopFeaturesParams
    rng = np.random.default_rng(2)
    vals = rng.normal(size=(30, 10)) * np.linspace(0.1, 2, 10)
    vals[3, 4] = np.nan
    dims = np.array(["a", "b", "c"])[rng.integers(0, 3, 30)]
    x = xr.DataArray(vals, dims=("pair", "feature"), coords={"pair": [f"p{i}" for i in range(30)],
                                                               "dimension": ("pair", dims), "feature": range(10)})
    x.attrs = {"units": "reward", "gauge": "invariant"}
    got = TopFeatures(TopFeaturesParams(k=3)).run(None, x)
    assert got.dims == ("dimension", "rank") and got.attrs["units"] == "reward"
    df = pd.DataFrame(vals).assign(dimension=dims)
    for g, sub in df.groupby("dimension"):
        sub = sub.drop(columns="dimension")
        order = sub.abs().mean().sort_values(ascending=False, kind="stable").index[:3]
        np.testing.assert_array_equal(got["feature_id"].sel(dimension=g).values, list(order))
        np.testing.assert_allclose(got.sel(dimension=g).values, sub.mean()[order].values)
    flat = TopFeatures(TopFeaturesParams(k=2, by=None)).run(None, x)
    assert flat.dims == ("rank",) and list(flat["feature_id"].values) == [9, 8]


def test_an_sae_trained_from_a_stored_capture_equals_one_trained_on_the_same_rows(tmp_path, monkeypatch):
    """train_on: store:… streams a stored readout capture (a YAML run; then a second YAML run reads it)."""
    from reward_lens_spec.run import execute
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.store import open_store
    url = str(tmp_path / "s.zarr")
    run, y = compose_run(["observable=score", "observable.outputs=[h,margin]", "dataset.limit=6"])
    first = execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=url, progress=False)
    (tmp_path / "conf" / "observable").mkdir(parents=True)
    (tmp_path / "conf" / "observable" / "sae_store.yaml").write_text(
        "name: sae_store\nsteps:\n"
        f"  - {{name: c, op: sae_attribution, train_on: 'store:{url}#{first.run_id}/score/h', d_sae: 8, k: 2,"
        " epochs: 5, chunk: 4}\n  - {name: e, op: sae_attribution, quantity: error,"
        f" train_on: 'store:{url}#{first.run_id}/score/h', d_sae: 8, k: 2, epochs: 5, chunk: 4}}\noutputs: [c, e]\n")
    monkeypatch.setenv("REWARD_LENS_SPEC_CONFIG_PATH", str(tmp_path / "conf"))
    run2, y2 = compose_run(["observable=sae_store", "dataset.limit=6"])
    second = execute(run2, resolved_yaml=y2, base_dir=str(tmp_path), store_url=url, progress=False)
    h = open_store(url).load(first.run_id, "score", lazy=False)["h"].transpose("pair", "side", "d_model").values
    want, _ = train_sae(rows_of(h, 4), h.shape[-1], 8, 2, epochs=5, seed=0)
    res = second.result
    assert res["c"].attrs["sae"] == want.digest()                              # the same rows, in the same order
    r = open_store(url).load(first.run_id, "score", lazy=False)["margin"].values
    np.testing.assert_allclose(res["c"].sum("feature").values + res["e"].values, r, atol=1e-4)


def test_on_a_gated_head_the_frozen_gate_decomposition_sums_to_the_models_own_margin(tmp_path):
    from reward_lens_spec.models.gated_head import attach_gated_head
    from reward_lens_spec.models.loading import wrap_model
    from reward_lens_spec.models.tiny import build_tiny
    model, tok = build_tiny("tiny_llama", seed=1, num_labels=1)
    attach_gated_head(model, 3, seed=1)
    lm = wrap_model("gated", model, tok)
    assert lm.head.gated
    sae = random_sae(d_in=lm.d_model, k=5, seed=5)
    save_sae(sae, tmp_path)
    kw = {"op": "sae_attribution", "path": str(tmp_path), "digest": sae.digest()}
    ds, ctx = _compute(lm, [{"name": "c", **kw}, {"name": "e", "quantity": "error", **kw}])
    enc = ctx.encoded
    for p in range(len(enc.pair_ids)):
        with torch.no_grad():
            r = [float(lm.model(input_ids=torch.tensor([list(s)])).logits[0, 0])
                 for s in (enc.chosen[p], enc.rejected[p])]
        got = float(ds["c"].isel(pair=p).sum()) + float(ds["e"].isel(pair=p))
        assert abs(got - (r[0] - r[1])) < 5e-5 * (1 + abs(r[0] - r[1])), (p, got, r)


def test_a_multi_objective_head_gets_one_exact_split_per_objective_and_top_features_per_objective(tmp_path):
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_llama", num_labels=3)
    sae = random_sae(d_in=lm.d_model, k=5, seed=6)
    save_sae(sae, tmp_path)
    kw = {"op": "sae_attribution", "path": str(tmp_path), "digest": sae.digest()}
    ds, ctx = _compute(lm, [{"name": "c", **kw}, {"name": "e", "quantity": "error", **kw},
                            {"name": "t", "op": "top_features", "input": "c", "k": 2}])
    assert ds["c"].dims == ("pair", "feature", "objective") and ds["t"].dims == ("dimension", "rank", "objective")
    enc = ctx.encoded
    for p in range(len(enc.pair_ids)):
        with torch.no_grad():
            r = [lm.model(input_ids=torch.tensor([list(s)])).logits[0].double().numpy()
                 for s in (enc.chosen[p], enc.rejected[p])]
        got = ds["c"].isel(pair=p).sum("feature").values + ds["e"].isel(pair=p).values
        np.testing.assert_allclose(got, r[0] - r[1], atol=5e-5)


def test_patch_effect_description_states_its_sign_and_a_naive_forward_agrees(loaded):
    """Issue 37 item 8: transplant's value is the rejected side's reward change (the margin change's negative),
    zero's is the margin change; each checked against a plain forward with the feature edited at h."""
    lm, sae, ds, ctx = loaded
    enc, D = ctx.encoded, np.asarray(sae.W_dec, np.float64)
    w = lm.model.score.weight[0].detach().double().numpy()
    assert "rejected side's reward" in ds["patch_effect"].attrs["description"]
    assert "its negative" in ds["patch_effect"].attrs["description"]
    assert ds["zeroed"].attrs["description"].startswith("margin change")
    checked = 0
    for p in range(3):
        (hc, rc), (hr, rr) = naive_readout(lm, enc.chosen[p]), naive_readout(lm, enc.rejected[p])
        fc, fr = naive_encode(sae, hc)[0], naive_encode(sae, hr)[0]
        for i in np.flatnonzero((fc != fr))[:3]:
            rr_patched = rr + w @ ((fc[i] - fr[i]) * D[i])        # the head is linear in h: r = w·h + b
            margin_change = (rc - rr_patched) - (rc - rr)
            got = float(ds["patch_effect"].isel(pair=p, feature=i))
            assert abs(got - (rr_patched - rr)) < 5e-5 and abs(got + margin_change) < 5e-5, (p, i)
            zeroed = (rc - w @ (fc[i] * D[i])) - (rr - w @ (fr[i] * D[i])) - (rc - rr)
            assert abs(float(ds["zeroed"].isel(pair=p, feature=i)) - zeroed) < 5e-5, (p, i)
            checked += abs(margin_change) > 1e-4
    assert checked >= 2


@pytest.mark.parametrize("fmt", ["pickle", "torch.save", "cfg not json"])
def test_weights_that_are_not_safetensors_give_one_line_and_are_never_unpickled(tmp_path, fmt):
    """A pickle named sae_weights.safetensors (issue 36: SafetensorError "header too large" traceback)."""
    import os
    import pickle

    import torch

    marker = tmp_path / "ran.marker"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    save_sae(random_sae(), tmp_path / "sae")
    weights = tmp_path / "sae" / "sae_weights.safetensors"
    if fmt == "pickle":
        weights.write_bytes(pickle.dumps({"W_enc": Evil()}))
    elif fmt == "torch.save":
        torch.save({"W_enc": Evil()}, weights)
    else:
        (tmp_path / "sae" / "cfg.json").write_text("{not json")
    with pytest.raises(SpecError) as e:
        load_sae(tmp_path / "sae", "observable.steps.path")
    text = str(e.value)
    assert text.startswith("observable.steps.path") and "\n" not in text, text
    assert ("cfg.json" if fmt == "cfg not json" else "a pickle") in text
    assert not marker.exists()
