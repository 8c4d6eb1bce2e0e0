"""Runs INSIDE the reward-lens 2.0.1 venv (see ``peer_venv.py``); never imported by our package.

Given the benchmark's pairs (JSONL: id, prompt, chosen, rejected), it builds or loads the model,
dumps how reward-lens tokenizes each side, times its instruments and writes every number the
cross-check needs as JSON.

Model (``--model``):
  ``tiny``    ``reward_lens.signals.from_tiny(seed=0, tokenizer_name=--tok-folder)``, saved with
              ``save_pretrained`` (model and tokenizer) to ``--export`` so the other side loads the
              identical weights;
  a folder    ``AutoModelForSequenceClassification.from_pretrained`` + ``AutoTokenizer`` wrapped by
              ``reward_lens.signals.loaders.wrap_hf_model`` (used for SmolLM2 with the seed-0 head).

Timed (``--repeats`` runs after one warm-up; ``--slow-repeats`` runs, no warm-up, for the
component patch grid when ``--slow`` is set): ``score`` (both sides through ``signal.score``),
``DirectLinearAttribution``, ``LensCrystallization`` and ``PatchGrid(granularity="component")``
through ``reward_lens.measure.base.run``. Forward passes are counted by a pre-hook on decoder layer
0 (one call per batched forward, cached re-runs included), reported per run.

Output JSON keys: ``versions``, ``threads``, ``tokenizer`` (class, fallback flag, pad id/side),
``tokens`` (per pair: chosen and rejected ids), ``collate_pad_side``, ``loadavg`` (1-min, start and
end), ``timings`` (name -> list of wall seconds), ``cpu`` (name -> list of process CPU seconds), ``forwards`` (name -> forwards per run), ``scores`` (pair × 2), ``lens``
(pair × (L+1), raw, layer −1 first), ``crystal_layer``, ``dla`` (pair × (1+2L): embed, attn_L0,
mlp_L0, ...; raw, no final norm), ``dla_names``, ``patch_effect`` (pair × 2L), ``patch_names``.
Exit status 2 when reward-lens silently fell back to its byte tokenizer (every number would differ).
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _load(args):
    from reward_lens.signals import loaders

    if args.model == "tiny":
        sig = loaders.from_tiny(seed=0, tokenizer_name=args.tok_folder)
        if args.export:
            sig.runtime.model.save_pretrained(args.export)
            sig.tokenizer.save_pretrained(args.export)
        return sig
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model, trust_remote_code=False)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, dtype=torch.float32, trust_remote_code=False)
    return loaders.wrap_hf_model(model, tok, device="cpu", architecture="LlamaForSequenceClassification")


def _timed(fn, counter, repeats, warmup=True):
    if warmup:
        fn()
    times, cpu, fwd, out = [], [], [], None
    for _ in range(repeats):
        counter[0] = 0
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        fwd.append(counter[0])
    return out, times, cpu, fwd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tok-folder")
    ap.add_argument("--export")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow-repeats", type=int, default=1)
    ap.add_argument("--slow", action="store_true", help="patch grid: --slow-repeats runs, no warm-up")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--skip", default="", help="comma list of instruments not to run")
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    import transformers

    import reward_lens
    from reward_lens.measure.base import Context, run
    from reward_lens.measure.battery.dla import DirectLinearAttribution
    from reward_lens.measure.battery.lens import LensCrystallization
    from reward_lens.measure.battery.patch import PatchGrid

    if args.threads:
        torch.set_num_threads(args.threads)
    pairs = [json.loads(line) for line in open(args.pairs) if line.strip()]
    t0 = time.perf_counter()
    sig = _load(args)
    load_s = time.perf_counter() - t0
    tok = sig.tokenizer
    fallback = type(tok).__name__ == "_MinimalByteTokenizer"
    view = [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs]
    chosen = [(p["prompt"], p["chosen"]) for p in pairs]
    rejected = [(p["prompt"], p["rejected"]) for p in pairs]
    out = {
        "versions": {"reward_lens": getattr(reward_lens, "__version__", "?"), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "threads": torch.get_num_threads(), "load_s": load_s,
        "tokenizer": {"class": type(tok).__name__, "fallback": fallback,
                      "pad_token_id": getattr(tok, "pad_token_id", None), "runtime_pad_id": sig.runtime.pad_id},
        "tokens": [[sig.tokenize(c).input_ids, sig.tokenize(r).input_ids] for c, r in zip(chosen, rejected)],
        "collate_pad_side": sig.runtime.collate([sig.tokenize(chosen[0]), sig.tokenize(rejected[0])]).meta["pad_side"],
        "timings": {}, "cpu": {}, "forwards": {}, "loadavg": [round(os.getloadavg()[0], 1)],
    }
    if fallback:
        json.dump(out, open(args.out, "w"))
        return 2

    model = sig.runtime.model
    counter = [0]
    base = getattr(model, "model", model)
    base.layers[0].register_forward_pre_hook(lambda *a: counter.__setitem__(0, counter[0] + 1))
    n_layers = int(sig.meta.n_layers)
    skip = set(filter(None, args.skip.split(",")))

    def score():
        c = sig.score(chosen, "reward").value.values
        r = sig.score(rejected, "reward").value.values
        return np.stack([c, r], axis=1)

    def obs(o):
        return lambda: run(o, Context(signal=sig, view=view)).value

    jobs = [("score", score, False), ("dla", obs(DirectLinearAttribution()), False),
            ("lens_crystallization", obs(LensCrystallization()), False),
            ("patch_component", obs(PatchGrid(granularity="component")), args.slow)]
    for name, fn, slow in jobs:
        if name in skip:
            continue
        res, times, cpu, fwd = _timed(fn, counter, args.slow_repeats if slow else args.repeats, warmup=not slow)
        out["timings"][name], out["forwards"][name] = times, fwd
        out["cpu"][name] = cpu
        if name == "score":
            out["scores"] = res.tolist()
        elif name == "dla":
            out["dla"], out["dla_names"] = res["differential"], res["component_names"]
        elif name == "lens_crystallization":
            out["lens"], out["crystal_layer"] = res["differential"], res["per_pair_crystal_layer"]
        else:
            out["patch_effect"], out["patch_names"] = res["per_pair_effect"], res["component_names"]
    out["n_layers"] = n_layers
    out["loadavg"].append(round(os.getloadavg()[0], 1))
    json.dump(out, open(args.out, "w"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
