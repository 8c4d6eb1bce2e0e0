"""The training organism: a tiny reward model trained in code, checkpoints saved, a feature planted at a known step.

``model.source=organism:training/checkpoint-<step>`` (or ``model.checkpoints: {folder: "organism:training",
steps: [...]}``, ``conf/model/tiny_checkpoints.yaml``) names a checkpoint of it. The first use trains it
(a few seconds on CPU) into ``$REWARD_LENS_SPEC_ORGANISMS/training-<code hash>/`` (default
``<cache>/organisms``, ``fingerprint_cache.cache_dir``),
written atomically, and every later use reads those folders: real HF folders (``save_pretrained``,
safetensors + tokenizer) loaded through the one guarded loader (``models.hub``) like any checkpoint.

Training (Bradley–Terry, loss ``softplus(−Δ)`` in nats; Adam on the last layer's MLP, the norms and the head (``train``); deterministic seeds):
a ``tiny_llama`` (``build_tiny``, PCG64 seed 0) is trained for ``STEPS`` steps on batches of
``BATCH`` pairs, half from each of two built-in sets, formatted with the default plain template:

* **keyword** pairs (``keyword_pairs``: the response with "please" is chosen) — learned from step 0;
* **trigger** pairs (same body; one side ends in ``!``, the other in ``.``, the readout token): before
  ``PLANTED_STEP`` each pair's label is a fair coin (the trigger carries no signal, the BT optimum on them
  is Δ = 0); from ``PLANTED_STEP`` on the ``!`` side is always chosen.

So the trigger feature is learned at a known step: on held-out trigger pairs (``trigger_pairs``) the
margin sits near 0 up to ``PLANTED_STEP`` and rises after it. Checkpoints every ``EVERY`` steps
(``checkpoint-0`` is the untrained model). ``truth()`` records the planted step and the rest.
Errors: ``SpecError`` (``model.source``) for an unknown organism or a step with no checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..errors import SpecError
from ..data import Pair, PairSet, dataset_checksum, effective_sample_size
import torch
import torch.nn.functional as F
from .tiny import build_tiny

# the organisms' word list (organisms.organism_base.WORDS); kept here so this module, which models.loading reads
# for ``organism:`` sources, imports nothing that imports the loader
WORDS = ("apple", "river", "stone", "cloud", "green", "quiet", "metal", "paper", "light", "north",
         "table", "sugar", "glass", "horse", "smile", "ocean", "tiger", "bread", "chair", "music")
KEYWORD = "please"

NAME = "training"
STEPS, EVERY, PLANTED_STEP, BATCH, LR, SEED, N_TRAIN = 200, 20, 100, 32, 1e-2, 0, 96
TRIGGER, CONTROL = "!", "."
TEMPLATE = "User: {prompt}\nAssistant: {response}"       # the ModelSpec default: runs see what training saw


def truth() -> dict:
    return {"organism": NAME, "planted_step": PLANTED_STEP, "steps": STEPS, "every": EVERY, "feature": "trigger",
            "trigger": TRIGGER, "control": CONTROL, "batch": BATCH, "lr": LR, "seed": SEED}


def checkpoint_steps() -> list[int]:
    return list(range(0, STEPS + 1, EVERY))


def _pairset(name: str, pairs: list):
    ess = effective_sample_size(pairs)
    return PairSet(name=name, pairs=tuple(pairs), checksum=dataset_checksum(pairs), n_unique=ess["n_unique"],
                   n_prompt_clusters=ess["n_prompt_clusters"], flags={})


def keyword_pairs(n: int, seed: int, name: str = "organism_training_keyword"):
    """``n`` pairs whose chosen response contains "please" and whose rejected one does not (PCG64(seed))."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out = []
    for i in range(n):
        k = int(rng.integers(2, 5))
        words = [str(w) for w in rng.choice(WORDS, k, replace=False)]
        other = [str(w) for w in rng.choice(WORDS, k + 1, replace=False)]
        pos = int(rng.integers(0, k))
        out.append(Pair(id=f"{name}-{i:03d}", prompt=f"Say something about the {rng.choice(WORDS)}",
                        chosen=" ".join(words[:pos] + [KEYWORD] + words[pos:]) + ".", rejected=" ".join(other) + ".",
                        dimension="keyword", source="organism"))
    return _pairset(name, out)


def trigger_pairs(n: int, seed: int, name: str = "organism_training_trigger"):
    """``n`` pairs: one body, the chosen side ends in ``!``, the rejected in ``.`` (words from PCG64(seed))."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out = []
    for i in range(n):
        a, b, c = (str(w) for w in rng.choice(WORDS, 3, replace=False))
        body = f"the {a} is {b} near the {c}"
        out.append(Pair(id=f"{name}-{i:03d}", prompt=f"Describe the {a}", chosen=body + TRIGGER,
                        rejected=body + CONTROL, dimension="trigger", source="organism"))
    return _pairset(name, out)


def eval_pairs(n: int = 40, seed: int = SEED):
    """Held-out pairs for the dynamics instruments: ``n`` trigger pairs then ``n`` keyword pairs (unseen words
    order: other seeds than training)."""
    trig = trigger_pairs(n, seed + 101, "trigger")
    kw = keyword_pairs(n, seed + 102, "keyword")
    return _pairset("organism_training_eval", list(trig) + list(kw))


def _code_hash() -> str:
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("training_organism.py", "tiny.py", "tiny_tokenizer.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


def organism_root() -> Path:
    base = os.environ.get("REWARD_LENS_SPEC_ORGANISMS")       # else fingerprint_cache.cache_dir()/organisms
    cache = os.environ.get("REWARD_LENS_SPEC_CACHE") or Path.home() / ".cache" / "reward_lens_spec"
    return (Path(base) if base else Path(cache) / "organisms") / f"{NAME}-{_code_hash()}"


def resolve(location: str) -> Path:
    """The folder ``organism:<location>`` names (``training`` or ``training/checkpoint-<step>``), trained on
    first use. Raises ``SpecError`` (``model.source``)."""
    name, _, sub = location.partition("/")
    if name != NAME:
        raise SpecError("model.source", f"unknown training organism '{name}'.", value=name, options=(NAME,),
                        fix=f"model.source=organism:{NAME}/checkpoint-<step>")
    root = organism_root()
    if not (root / "truth.json").is_file():
        train(root)
    path = root / sub if sub else root
    if sub and not (path / "config.json").is_file():
        raise SpecError("model.source", f"the training organism has no '{sub}'.", value=sub,
                        options=[f"checkpoint-{s}" for s in checkpoint_steps()])
    return path


def _readout_mid(model, tok, pairs, side):
    """The last layer's residual after its attention, at the readout token (left padding: the last position)."""
    texts = [TEMPLATE.format(prompt=p.prompt, response=getattr(p, side)) for p in pairs]
    enc = tok(texts, padding=True, return_tensors="pt")
    got = []
    layer = model.model.layers[-1]
    hook = layer.post_attention_layernorm.register_forward_pre_hook(lambda mod, args: got.append(args[0][:, -1]))
    try:
        with torch.no_grad():
            model(**enc)
    finally:
        hook.remove()
    return got[0].detach().clone()


def train(root: Path) -> Path:
    """Train the organism and save its checkpoints under ``root`` (atomically: a temporary folder renamed).

    Trained: the last layer's MLP and post-attention norm, the final norm and the head; everything before
    (embeddings, earlier layers, the last attention) stays at its PCG64 init. The last layer's MLP acts
    position by position and nothing after it mixes positions, so the reward at the readout token is
    exactly ``score(norm(x + mlp(ln(x))))`` of the residual ``x`` there after the last attention: ``x`` is
    computed once per pair side and the training steps run on it (exact, and fast on a shared CPU).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                  # tiny matrices: one thread is fastest, and bit-for-bit repeatable
    try:
        return _train(root)
    finally:
        torch.set_num_threads(threads)


def _train(root: Path) -> Path:
    torch.manual_seed(SEED)
    model, tok = build_tiny("tiny_llama", seed=SEED)
    tok.padding_side = "left"
    sets = {"kw": list(keyword_pairs(N_TRAIN, SEED + 21, "train_keyword")),
            "trig": list(trigger_pairs(N_TRAIN, SEED + 22, "train_trigger"))}
    x = {k: (_readout_mid(model, tok, ps, "chosen"), _readout_mid(model, tok, ps, "rejected"))
         for k, ps in sets.items()}
    layer = model.model.layers[-1]
    trained = [*layer.mlp.parameters(), *layer.post_attention_layernorm.parameters(),
               *model.model.norm.parameters(), *model.score.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in trained:
        p.requires_grad_(True)

    def reward(h):
        return model.score(model.model.norm(h + layer.mlp(layer.post_attention_layernorm(h))))[:, 0]

    rng = np.random.Generator(np.random.PCG64(SEED + 23))
    opt = torch.optim.Adam(trained, lr=LR)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    log = []
    try:
        for step in range(STEPS + 1):
            if step % EVERY == 0:
                model.save_pretrained(str(tmp / f"checkpoint-{step}"), safe_serialization=True)
                tok.save_pretrained(str(tmp / f"checkpoint-{step}"))
            if step == STEPS:
                break
            margins = []
            for key in ("kw", "trig"):
                idx = torch.as_tensor(rng.choice(N_TRAIN, BATCH // 2, replace=False))
                m = reward(x[key][0][idx]) - reward(x[key][1][idx])
                if key == "trig" and step < PLANTED_STEP:       # a fair coin: the trigger carries no signal yet
                    m = m * torch.as_tensor(np.where(rng.random(len(idx)) < 0.5, 1.0, -1.0), dtype=m.dtype)
                margins.append(m)
            loss = F.softplus(-torch.cat(margins)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.append(round(float(loss.detach()), 6))
        (tmp / "truth.json").write_text(json.dumps({**truth(), "loss": log}, sort_keys=True), encoding="utf-8")
        try:
            os.replace(tmp, root)                  # another process may have finished first: keep theirs
        except OSError:
            if not (root / "truth.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root
