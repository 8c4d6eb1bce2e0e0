"""Ensembles of reward models (issue 28 item 4): every member against a plain forward written here."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.tiny import build_tiny
from reward_lens_spec.planning import plan_for
from reward_lens_spec.run import compose_run, execute

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    d = tmp_path_factory.mktemp("ens")
    for reduce in ("mean", "min", "quantile"):
        run, y = compose_run(["observable=ensemble", "model=tiny_ensemble", "dataset.limit=6",
                              f"model.ensemble.reduce={reduce}", "model.ensemble.q=0.25"])
        out[reduce] = execute(run, resolved_yaml=y, base_dir=str(d), store_url=str(d / "s.zarr"), progress=False)
    return out


def _plain_member_rewards(run_result):
    """Each member (tiny Llama of seed s) scored separately: one unpadded forward per side, logits[-1]."""
    from reward_lens_spec.inputs import encode, load_dataset, load_lm
    run, _ = compose_run(["observable=ensemble", "model=tiny_ensemble", "dataset.limit=6"])
    pairs = load_dataset(run.dataset)
    lm = load_lm(run.model)
    enc = encode(lm, pairs, run.model)
    assert list(enc.pair_ids) == [str(p) for p in run_result.pair.values]
    out = np.zeros((len(enc.pair_ids), 2, len(SEEDS)))
    for m, seed in enumerate(SEEDS):
        model, _ = build_tiny("tiny", seed=seed)
        with torch.no_grad():
            for i in range(len(enc.pair_ids)):
                for s, ids in enumerate((enc.chosen[i], enc.rejected[i])):
                    out[i, s, m] = model(input_ids=torch.tensor([ids])).logits[0, 0].item()
    return out


def test_members_and_reductions_match_plain_forwards(runs):
    res = runs["mean"].result
    plain = _plain_member_rewards(res)
    np.testing.assert_allclose(res["member_margin"].transpose("pair", "member").values,
                               plain[:, 0] - plain[:, 1], atol=1e-5)
    assert list(res["member_margin"].member.values) == ["tiny_s0", "tiny_s1", "tiny_s2"]
    want = {"mean": plain.mean(-1), "min": plain.min(-1), "quantile": np.quantile(plain, 0.25, axis=-1)}
    for reduce, out in runs.items():
        r = out.result["reward"].transpose("pair", "side").values
        np.testing.assert_allclose(r, want[reduce], atol=1e-5)
        np.testing.assert_allclose(out.result["margin"].values, r[:, 0] - r[:, 1], atol=1e-12)
    assert len({o.run_id for o in runs.values()}) == 3          # the reduce is in the run id


def test_agreement_matches_a_hand_computation(runs):
    res = runs["mean"].result
    mm = res["member_margin"].transpose("pair", "member").values
    sign = res["member_sign_agreement"].values
    rho = res["member_rank_correlation"].values
    k = mm.shape[1]
    ranks = np.argsort(np.argsort(mm, 0), 0).astype(float)        # no ties among float margins
    for i in range(k):
        for j in range(k):
            assert sign[i, j] == np.mean(np.sign(mm[:, i]) == np.sign(mm[:, j]))
            a, b = ranks[:, i] - ranks[:, i].mean(), ranks[:, j] - ranks[:, j].mean()
            np.testing.assert_allclose(rho[i, j], (a @ b) / np.sqrt((a @ a) * (b @ b)), atol=1e-12)
    assert np.all(np.diag(sign) == 1.0)


def test_member_fingerprints_in_identity_and_outputs(runs, tmp_path):
    from reward_lens_spec.models.fingerprint import model_fingerprint
    res = runs["mean"].result
    fps = [model_fingerprint(*build_tiny("tiny", seed=s)) for s in SEEDS]
    assert res["member_margin"].attrs["member_fingerprints"] == fps
    run, y = compose_run(["observable=ensemble", "model=tiny_ensemble", "dataset.limit=6",
                          "model.members=[{name: tiny_s0, source: 'builtin:tiny', seed: 0}, "
                          "{name: tiny_s1, source: 'builtin:tiny', seed: 1}, {name: tiny_s2, source: 'builtin:tiny', seed: 5}]"])
    other = execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"), progress=False)
    assert other.run_id != runs["mean"].run_id
    assert other.result["member_margin"].attrs["member_fingerprints"][:2] == fps[:2]
    assert other.result["member_margin"].attrs["member_fingerprints"][2] != fps[2]


@pytest.mark.parametrize("observable", ["dla", "lens", "patch"])
def test_one_stream_instruments_refused_with_one_line_reason(observable):
    run, _ = compose_run([f"observable={observable}", "model=tiny_ensemble"])
    with pytest.raises(SpecError, match="model.kind=ensemble") as e:
        plan_for(run)
    assert "per member" in str(e.value)


@pytest.mark.parametrize("override,key", [("model.ensemble.reduce=median", "model.ensemble.reduce"),
                                          ("model.members=[tiny]", "model.members"),
                                          ("model.ensemble.reduce=quantile model.ensemble.q=2", "model.ensemble.q")])
def test_bad_ensemble_config_is_a_spec_error(override, key):
    with pytest.raises(SpecError, match=key.replace(".", r"\.")):
        compose_run(["observable=ensemble", "model=tiny_ensemble", *override.split()])
