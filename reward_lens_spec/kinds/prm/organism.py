"""A PRM model organism: a tiny process reward model with a planted bad step (by construction).

Start from the tiny Llama sequence classifier (``build_tiny``, PCG64 weights). With ``u`` a unit reward
direction and ``v`` a unit direction orthogonal to it:

* head row ``w_r = u`` (bias 0), final-norm gains 1, so ``r = u·N(x)`` at every position;
* the "flaw" token ``#`` gets ``+β·v`` on its embedding (no other text of the organism contains ``#``);
* layer 0, attention head 0: its query rows are zeroed, so it attends uniformly over the prefix; value
  row 0 of its key-value group reads ``v`` and output column 0 writes ``−s·γ·u`` (the other columns of
  head 0, and the column of head 1 that would read the same value row, are zeroed).

So from the flaw on, every position's residual gets ``−s·γ·u`` times the share of flaw tokens in its
prefix: the reward read at a step boundary drops at the first step containing ``#`` and stays lower after
(diluted as the prefix grows). Strength ``s`` ∈ ``STRENGTHS`` scales only that write (0: nothing planted).

Pairs (``prm_pairs``): one problem, a response of ``n_steps`` steps each ending in the delimiter
``"\\n"``; the chosen side is all clean, the rejected side has ``#`` in step ``bad_step`` (drawn per pair).
Truth: ``{"bad_step": {pair id: k}, "unit": "attn_L0", "head": 0, "step_reward": {pair id: [chosen steps,
rejected steps]}}``. Graded by ``prm_steps``: the step whose step-reward drop ``r_k − r_{k−1}`` (rejected side;
``r_{−1}`` = 0 drop at the first step measured against the chosen side) is most negative is the planted step,
and every step's reward equals ``step_reward`` (``plain_step_rewards``: its own tokenization and a plain
forward, none of the capture or operator code).
"""
from __future__ import annotations

import numpy as np
import torch

from ...data import Pair
from ...organisms.organism_base import WORDS, Organism, pairset
from ...models.loading import wrap_model
from .steps import PrmSignal, step_ids
from ...models.tiny import build_tiny

FLAW, STEP = "#", "\n"
PRM_GAMMA = 0.3        # the flaw head's write: readings rise with s over the whole grid (at 4 the norm saturates)
TEMPLATE = "Problem: {prompt}\nSolution:\n{response}"


def prm_pairs(n: int = 8, n_steps: int = 4, seed: int = 0) -> tuple[list[Pair], dict[str, int]]:
    """``n`` pairs of ``n_steps`` steps; the rejected side's planted bad step per pair id."""
    rng = np.random.Generator(np.random.PCG64(seed + 11))
    pairs, truth = [], {}
    for i in range(n):
        words = [str(w) for w in rng.choice(WORDS, n_steps + 1, replace=False)]
        bad = int(rng.integers(0, n_steps))
        steps = [f"the {words[k]} is {words[k + 1]}{STEP}" for k in range(n_steps)]
        flawed = [s.replace(" is ", f" is {FLAW}") if k == bad else s for k, s in enumerate(steps)]
        pid = f"prm-{i:03d}"
        pairs.append(Pair(id=pid, prompt=f"relate the {words[0]} to the {words[-1]}", chosen="".join(steps),
                          rejected="".join(flawed), dimension="prm_planted", source="organism"))
        truth[pid] = bad
    return pairs, truth


@torch.no_grad()
def prm_organism(strength: float, *, seed: int = 0, n_pairs: int = 8, n_steps: int = 4, beta: float = 1.0,
                 gamma: float = 4.0) -> Organism:
    """The PRM organism at ``strength`` (see the module docstring); ``lm.signal`` is its ``PrmSignal``."""
    model, tok = build_tiny("tiny_llama", seed=seed)
    d = model.config.hidden_size
    rng = np.random.Generator(np.random.PCG64(seed + 1100))
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    v = rng.normal(size=d)
    v -= (v @ u) * u
    v /= np.linalg.norm(v)
    t = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    model.score.weight.copy_(t(u[None]))
    model.model.norm.weight.fill_(1.0)
    flaw = tok(FLAW, add_special_tokens=False)["input_ids"][0]
    model.model.embed_tokens.weight[flaw] += t(beta * v)
    attn = model.model.layers[0].self_attn
    hd = model.config.hidden_size // model.config.num_attention_heads
    attn.q_proj.weight[:hd] = 0.0                       # head 0: uniform attention over the prefix
    attn.v_proj.weight[0] = t(v)                        # kv group 0, value row 0 reads v
    attn.o_proj.weight[:, :hd] = 0.0                    # head 0 writes only through column 0 …
    attn.o_proj.weight[:, 0] = t(-strength * gamma * u)   # … along −u
    attn.o_proj.weight[:, hd] = 0.0                     # head 1 shares that value row: silence it
    lm = wrap_model("prm_organism", model, tok)
    lm.signal = PrmSignal(step_token=STEP, step_ids=step_ids(tok, STEP))
    pairs, truth = prm_pairs(n_pairs, n_steps, seed)
    return Organism(kind="prm_planted", strength=float(strength), lm=lm, pairs=pairset("organism_prm", pairs),
                    truth={"bad_step": truth, "unit": "attn_L0", "head": 0,
                           "step_reward": plain_step_rewards(model, tok, pairs, TEMPLATE)},
                    params={"seed": seed, "n_pairs": n_pairs, "n_steps": n_steps, "beta": beta, "gamma": gamma,
                            "template": TEMPLATE})


@torch.no_grad()
def plain_step_rewards(model, tok, pairs, template: str = TEMPLATE, delim: str = STEP) -> dict[str, list]:
    """Per pair id, ``[chosen, rejected]`` lists of the head's reward (reward units) at every step end: each
    ``delim`` token of the response, and the response's last token when it does not end with ``delim`` (an
    unterminated final step). Its own tokenization (``template`` filled as text, the tokenizer's special
    tokens on; the response starts after the empty-response encoding) and a plain forward, batch of one:
    ``score(model.model(ids))`` at every position, float64. As many steps as each side has (no fixed count)."""
    (d_id,) = tok(delim, add_special_tokens=False)["input_ids"]
    out = {}
    for p in pairs:
        sides = []
        for resp in (p.chosen, p.rejected):
            ids = tok(template.format(prompt=p.prompt, response=resp))["input_ids"]
            start = len(tok(template.format(prompt=p.prompt, response=""))["input_ids"])
            ends = [i for i in range(start, len(ids)) if ids[i] == d_id]
            if not resp.endswith(delim):
                ends.append(len(ids) - 1)
            h = model.model(input_ids=torch.tensor([ids])).last_hidden_state
            r = model.score(h)[0, :, 0].double().numpy()
            sides.append([float(r[i]) for i in ends])
        out[p.id] = sides
    return out


def located_steps(step_reward: np.ndarray) -> np.ndarray:
    """The step each pair's rejected side goes wrong at, read from ``prm_steps`` rewards (pair × side × step):
    the most negative change of the rejected − chosen step margin from one step to the next (step 0 against 0)."""
    gap = step_reward[:, 1] - step_reward[:, 0]          # rejected − chosen per step
    drop = np.diff(np.concatenate([np.zeros((gap.shape[0], 1)), gap], 1), axis=1)
    return np.nanargmin(drop, 1)


def prm_planted(strength: float, **kw) -> Organism:
    """The ``prm_planted`` organism at ``strength`` (γ = ``PRM_GAMMA`` unless ``kw`` sets ``gamma``; built on
    ``tiny_llama`` only, so ``base`` is ignored): the builder the kind registers (``kinds.prm.KIND.organisms``)."""
    kw.pop("base", None)
    kw.setdefault("gamma", PRM_GAMMA)
    return prm_organism(strength, **kw)
