"""Fast-tier checks of modules otherwise reached only by slow tests (issue 27 item 6: the fast tier covers every
module): ``python -m reward_lens_spec``, the training organism's pair sets and errors, the planted sparse
feature organism, and verification by recomputation."""
from __future__ import annotations

import runpy
import sys

import numpy as np
import pytest

from reward_lens_spec.errors import SpecError


def test_python_dash_m_is_the_cli(monkeypatch, capsys):
    from reward_lens_spec.cli import help_text

    monkeypatch.setattr(sys, "argv", ["reward_lens_spec", "help"])
    runpy.run_module("reward_lens_spec", run_name="__main__")
    assert capsys.readouterr().out.strip() == help_text().strip()
    monkeypatch.setattr(sys, "argv", ["reward_lens_spec", "hepl"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("reward_lens_spec", run_name="__main__")
    assert e.value.code != 0 and "help" in capsys.readouterr().err      # "did you mean", not a traceback


def test_training_organism_pairs_carry_the_planted_signal_and_nothing_else():
    from reward_lens_spec.models import training_organism as t

    kw = t.keyword_pairs(30, 4)
    for p in kw:                                   # "please" on the chosen side only, as a whole word
        assert t.KEYWORD in p.chosen.rstrip(".").split() and t.KEYWORD not in p.rejected.split()
    trig = t.trigger_pairs(30, 4)
    for p in trig:                                 # one body; only the readout character differs
        assert p.chosen[:-1] == p.rejected[:-1]
        assert (p.chosen[-1], p.rejected[-1]) == (t.TRIGGER, t.CONTROL)
    ev = t.eval_pairs(5)
    assert [p.dimension for p in ev] == ["trigger"] * 5 + ["keyword"] * 5
    assert ev.checksum == t.eval_pairs(5).checksum != t.eval_pairs(5, seed=1).checksum
    steps = t.checkpoint_steps()
    assert steps[0] == 0 and steps[-1] == t.STEPS and t.PLANTED_STEP in steps
    assert t.truth()["planted_step"] == t.PLANTED_STEP
    with pytest.raises(SpecError, match="model.source") as e:
        t.resolve("trainng/checkpoint-20")
    assert "organism:training" in str(e.value)


def test_sparse_feature_organism_margin_is_carried_by_the_planted_atom():
    import torch

    from reward_lens_spec.organisms.sae_organism import sparse_feature_organism

    def margins(org):
        tok, model = org.lm.tokenizer, org.lm.model
        out = []
        with torch.inference_mode():
            for p in org.pairs:
                r = [model(input_ids=torch.tensor([tok(f"User: {p.prompt}\nAssistant: {s}")["input_ids"]])).logits
                     for s in (p.chosen, p.rejected)]
                out.append(float(r[0][0, 0] - r[1][0, 0]))
        return np.array(out)

    org = sparse_feature_organism(n_pairs=16)
    U = np.array(org.truth["atoms"])
    np.testing.assert_allclose(U @ U.T, np.eye(len(U)), atol=1e-6)                       # orthonormal atoms
    w = org.lm.model.score.weight.detach().numpy()[0]
    np.testing.assert_allclose(w, 2.0 * U[0], atol=1e-6)                                   # head row = gain·u_0
    assert org.lm.model.score.bias is None
    planted, none = margins(org), margins(sparse_feature_organism(0.0, n_pairs=16))
    assert np.abs(planted).max() > 1.0                       # pairs whose chosen side carries u_0
    assert np.abs(none).max() < 0.01 * np.abs(planted).max()  # strength 0: nothing carries the margin
    with pytest.raises(ValueError, match="n_ends"):
        sparse_feature_organism(n_ends=1)


def test_recompute_agrees_with_a_stored_run_and_skips_what_it_cannot(tmp_path, one_thread):
    from test_trust import execute_run, make_run

    from reward_lens_spec.store import open_store
    from reward_lens_spec.trust.recompute import _max_diff, recompute_run

    assert _max_diff(np.array([1.0, np.nan, 3.0]), np.array([1.0, np.nan, 2.5])) == 0.5   # NaN = NaN
    assert _max_diff(np.array([np.nan]), np.array([1.0])) == np.inf                     # NaN ≠ a number
    url = str(tmp_path / "s.zarr")
    rid = execute_run(url, tmp_path, make_run(observable="score", limit=4))
    ok, detail = recompute_run(open_store(url), rid, 2, base_dir=str(tmp_path))
    assert ok is True and "recomputed 2 pair(s)" in detail and "margin max|Δ|" in detail, detail
    st = open_store(url)
    doc = st.document(rid)
    st.document = lambda r: {k: v for k, v in doc.items() if k != "config_yaml"}
    assert recompute_run(st, rid, 2, base_dir=str(tmp_path)) == (None, "no resolved run config to recompute from")
