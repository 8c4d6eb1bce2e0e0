"""Per-token reward: observable=prefix on tiny models, checked against the model run on each prefix alone.

The reward at response position t must equal the model's own score of the sequence cut after that
token (causal attention: the cut sequence's last h is the full sequence's h_t); the last position
must equal ``reward`` exactly; the margin lines up both sides from the response start and is NaN
beyond either side; the lens' last layer is the reward minus the bias.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch


def run_cfg(tmp_path, *overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from reward_lens_spec.paths import conf_dir
    from reward_lens_spec.run import execute
    from reward_lens_spec.spec import register_configs, validate
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["observable=prefix", "dataset.limit=5", *overrides])
    return execute(validate(cfg), resolved_yaml=OmegaConf.to_yaml(cfg), base_dir=str(tmp_path),
                   store_url=str(tmp_path / "s.zarr"), progress=False)


@pytest.mark.parametrize("model", ["tiny", "tiny_gated", "tiny_gpt2"])
def test_prefix_reward_matches_the_model_on_each_prefix(tmp_path, model):
    from reward_lens_spec.data import load_pairs
    from reward_lens_spec.models.formatting import encode_pairs
    from reward_lens_spec.models.loading import load_model
    from reward_lens_spec.spec import ModelSpec, HeadKind
    res = run_cfg(tmp_path, f"model={model}").result
    pr, reward = res["prefix_reward"], res["reward"]
    n_tok = res["response_tokens"]
    for pid in pr["pair"].values:                       # the last position is the reward, exactly
        for side in ("chosen", "rejected"):
            k = int(n_tok.sel(pair=pid, side=side))
            row = pr.sel(pair=pid, side=side).values
            assert row[k - 1] == reward.sel(pair=pid, side=side).item()
            assert np.isfinite(row[:k]).all() and np.isnan(row[k:]).all()
    spec = ModelSpec(name=model, source=f"builtin:{'tiny' if model == 'tiny_gated' else model}",
                     head=HeadKind.gated if model == "tiny_gated" else HeadKind.linear,
                     num_labels=4 if model == "tiny_gated" else 1)
    lm = load_model(spec)
    pairs = list(load_pairs("diagnostic", limit=5))
    enc = encode_pairs(lm.tokenizer, pairs)
    with torch.no_grad():                               # independent: the model's own logits on each cut
        for i in range(2):
            ids = enc.chosen[i]
            k = int(n_tok.sel(pair=enc.pair_ids[i], side="chosen"))
            for t in (0, k // 2, k - 1):
                cut = ids[:len(ids) - k + t + 1]
                ref = lm.model(input_ids=torch.tensor([cut])).logits[0, 0].item()
                got = pr.sel(pair=enc.pair_ids[i], side="chosen").values[t]
                assert got == pytest.approx(ref, rel=1e-4, abs=1e-5)
    m = res["prefix_margin"].values
    both = np.minimum(res["response_tokens_chosen"].values, res["response_tokens_rejected"].values)
    for j in range(m.shape[0]):
        np.testing.assert_array_equal(m[j, :both[j]], pr.values[j, 0, :both[j]] - pr.values[j, 1, :both[j]])
        assert np.isnan(m[j, both[j]:]).all()
    lens_last = res["prefix_lens"].isel(layer=-1).values
    b = float(lm.head.b[0])
    np.testing.assert_allclose(lens_last + b, pr.values, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_response_starts_after_the_prompt(tmp_path):
    from reward_lens_spec.models.formatting import encode_pairs
    from reward_lens_spec.engine.per_token import response_starts
    from reward_lens_spec.data import Pair
    from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer
    tok = build_tiny_tokenizer()
    pairs = [Pair(id="a", prompt="Hi?", chosen="Yes indeed.", rejected="No."),
             Pair(id="b", prompt="x" * 40, chosen="long " * 5, rejected="short")]
    enc = encode_pairs(tok, pairs, max_length=40)       # pair b's prompt is cut from the left
    assert enc.n_truncated == 1 and not enc.response_truncated
    st = response_starts(tok, pairs, enc)
    for i, p in enumerate(pairs):
        for s, resp in enumerate((p.chosen, p.rejected)):
            ids = (enc.chosen, enc.rejected)[s][i]
            assert tok.decode(ids[st[i, s]:], skip_special_tokens=True).endswith(resp)
            assert len(ids) - st[i, s] == len(tok(resp, add_special_tokens=False)["input_ids"])
