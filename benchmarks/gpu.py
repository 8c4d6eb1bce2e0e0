"""One-command GPU benchmark: bare forward vs capture pass vs streamed battery, pairs/s and peak GPU memory.

    python benchmarks/gpu.py                  # on a CUDA machine: 1B- and 8B-shaped random Llamas, bf16
    python benchmarks/gpu.py --smoke          # anywhere: tiny shapes on CPU, to check the script runs

Models are random-init Llama sequence classifiers shaped like Llama-3.2-1B (d 2048, 16 layers, 32/8
heads, MLP 8192, vocab 128256) and Llama-3.1-8B (d 4096, 32 layers, 32/8 heads, MLP 14336), built on
the device in ``--dtype`` (bfloat16; the head is read in float32 by the capture's read-off and
self-checked with that dtype's tolerance). Token ids come from the built-in byte tokenizer (ids
< 260), sides ~``--side-tokens`` long. For each model: bare ``model(input_ids, attention_mask,
position_ids)`` over the capture's own length-sorted batches, the capture pass with every site the
battery needs, and the battery streamed into a local store (patching on the first ``--patch-pairs``
pairs). Each is timed once after a warm-up batch, with ``torch.cuda.synchronize``; peak memory is
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. Sized to finish in under 8
minutes on one H100/H200. Writes ``benchmarks/results_gpu.md`` saying which device it ran on.
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPES = {"llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                              num_key_value_heads=8, vocab_size=128256),
          "llama3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                              num_key_value_heads=8, vocab_size=128256),
          "smoke": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=512)}


def build(shape: str, dtype: str, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from reward_lens_spec.models.loading import wrap_model
    from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer
    tok = build_tiny_tokenizer()
    cfg = LlamaConfig(**SHAPES[shape], num_labels=1, pad_token_id=tok.pad_token_id, rope_theta=500000.0,
                      max_position_embeddings=8192)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForSequenceClassification(cfg).to(getattr(torch, dtype)).eval()
    return wrap_model(shape, model, tok, dtype=dtype, device=device)


def pairs_of(n: int, side_tokens: int):
    from reward_lens_spec.data import Pair
    words = side_tokens // 6 + 1
    return [Pair(id=f"g{i}", prompt=" ".join(f"w{(i * 7 + j) % 1000}" for j in range(words)),
                 chosen=" ".join(f"c{(i + j) % 97}" for j in range(words // 2 + i % 5)),
                 rejected=" ".join(f"r{(i * 3 + j) % 89}" for j in range(words // 2 + i % 3))) for i in range(n)]


def _sync(device):
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak(device, reset=False):
    import torch
    if not device.startswith("cuda"):
        return float("nan")
    if reset:
        torch.cuda.reset_peak_memory_stats()
        return 0.0
    return torch.cuda.max_memory_allocated() / 2**30


def bench_model(shape, args, device):
    import torch
    from reward_lens_spec.models.capture import capture
    from reward_lens_spec.inputs import encode
    from reward_lens_spec.models.padding import batches_by_length, pad_batch
    from reward_lens_spec.observables import load_observable
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.spec import StoreSpec
    from reward_lens_spec.store._backend import Backend
    from reward_lens_spec.store.writer import check_layout
    from reward_lens_spec.run.stream import stream

    t0 = time.perf_counter()
    lm = build(shape, args.dtype, device)
    built = time.perf_counter() - t0
    n = args.pairs if shape != "llama3.1-8b" else max(1, args.pairs // 2)
    pairs = pairs_of(n, args.side_tokens)
    tmpl = "User: {prompt}\nAssistant: {response}"
    enc = encode(lm, pairs, fmt="plain", template=tmpl, max_length=4 * args.side_tokens)
    obs = load_observable("battery")
    obs.pairs = args.patch_pairs
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name, pairs=obs.pairs)
    plan = build_plan(obs, info, load_observable)
    seqs = [s for p in zip(enc.chosen, enc.rejected) for s in p]
    batches = batches_by_length([len(s) for s in seqs], args.batch_size, None)
    pad = lm.tokenizer.pad_token_id
    rows = {}

    def bare():
        with torch.inference_mode():
            for b in batches:
                ids, mask, pos, _ = pad_batch([seqs[i] for i in b], pad, "left")
                lm.model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                         use_cache=False)

    def cap():
        capture(lm, enc, plan.sites, batch_size=args.batch_size)

    def battery():
        url = tempfile.mkdtemp(prefix="rl_gpu_") + "/s.zarr"
        b = Backend(url)
        check_layout(b, create=True)
        stream(b, "r", lm, pairs, enc, plan, info, capture_kw=dict(batch_size=args.batch_size), frame=None,
               store_spec=StoreSpec(chunk_pairs=args.chunk_pairs),
               run_attrs=lambda c, ch, r, logits: {"observables": [plan.observable], "chunks": ch})

    for name, fn in (("bare forward", bare), ("capture pass (battery sites)", cap), ("battery, streamed", battery)):
        if name != "battery, streamed":
            fn()                                   # warm-up (kernels, allocator)
        _sync(device)
        _peak(device, reset=True)
        t = time.perf_counter()
        fn()
        _sync(device)
        wall = time.perf_counter() - t
        rows[name] = (wall, n / wall, _peak(device))
    tokens = sum(len(s) for s in seqs)
    return {"shape": shape, "pairs": n, "tokens": tokens, "built_s": built, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks the script, not a GPU")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--side-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--chunk-pairs", type=int, default=64)
    ap.add_argument("--patch-pairs", type=int, default=16)
    ap.add_argument("--out", default=str(HERE / "results_gpu.md"))
    args = ap.parse_args()
    import torch
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    if args.smoke:
        args.pairs, args.side_tokens, args.batch_size, args.chunk_pairs, args.patch_pairs = 8, 24, 4, 4, 2
    shapes = ["llama3.2-1b", "llama3.1-8b"] if cuda else ["smoke"]
    where = (f"GPU: {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}), torch {torch.__version__}" if cuda else
             f"NOT a GPU run: CPU ({platform.processor() or platform.machine()}), torch {torch.__version__}; "
             "tiny 'smoke' shapes only — these numbers say nothing about GPU speed")
    t0 = time.perf_counter()
    results = []
    for s in shapes:
        results.append(bench_model(s, args, device))   # the model is freed when bench_model returns
        if cuda:
            torch.cuda.empty_cache()
    lines = [f"## GPU benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"Ran on: {where}.", f"Command: `python benchmarks/gpu.py {' '.join(sys.argv[1:])}`; dtype {args.dtype}; "
             f"batch {args.batch_size} sequences; chunk {args.chunk_pairs} pairs; patching on the first "
             f"{args.patch_pairs} pairs; total {time.perf_counter() - t0:.0f} s.", ""]
    for r in results:
        lines += [f"### {r['shape']}: {r['pairs']} pairs, {r['tokens']} tokens (model built in {r['built_s']:.1f} s)", "",
                  "| pass | wall (s) | pairs/s | peak GPU memory (GiB) | × bare |", "|---|---:|---:|---:|---:|"]
        bare = r["rows"]["bare forward"][0]
        for name, (wall, pps, peak) in r["rows"].items():
            lines.append(f"| {name} | {wall:.2f} | {pps:.1f} | {peak:.2f} | {wall / bare:.2f} |")
        lines.append("")
    with open(args.out, "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
