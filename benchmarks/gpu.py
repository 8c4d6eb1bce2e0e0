"""One-command GPU benchmark: bare forward vs capture pass vs streamed battery, pairs/s and peak GPU memory.

    python benchmarks/gpu.py                  # on a CUDA machine: 1B- and 8B-shaped random Llamas, bf16, then at scale
    python benchmarks/gpu.py --scale-only     # only the at-scale run: 8B shape, 10,000 pairs × 512 tokens
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

At scale (``bench_scale``, issue 40 item 7): the 8B-shaped model is saved as a checkpoint folder (safetensors,
in ``--dtype``) and the battery runs on ``--scale-pairs`` pairs (10,000) whose sides are about
``--scale-tokens`` tokens (512) through the user's route (``reward_lens_spec.run``, the command line's
composition and executor, data from a JSONL file) with ``model.device_map=auto`` and ``model.batch_size=auto``
(patching on the first ``--patch-pairs`` pairs). It prints pairs per second, peak GPU memory
(``torch.cuda.max_memory_allocated``), peak RSS (of this process; the model is built and saved by a child
process, so with ``--scale-only`` it is the run's), the batch size ``auto`` chose, the map, and the wall time
against the goal of ``--goal-s`` (600 s: 10 minutes on one H200); on a GPU the run shows its progress bar, so
a log cut off by a time limit still shows the rate. ``--smoke`` runs the same route on CPU with the tiny shape.
"""
from __future__ import annotations

import argparse
import multiprocessing
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
    from reward_lens_spec.engine.capture import capture
    from reward_lens_spec.inputs import encode
    from reward_lens_spec.models.padding import batches_by_length, pad_batch
    from reward_lens_spec.observables import load_observable
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.spec import StoreSpec
    from reward_lens_spec.store._backend import Backend
    from reward_lens_spec.store.layout import check_layout
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


def save_model(shape: str, dtype: str, device: str, folder: str) -> None:
    """``build(shape)`` saved as a checkpoint folder (safetensors, in ``dtype``) with its tokenizer."""
    lm = build(shape, dtype, device)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)


def bench_scale(args, device: str, cuda: bool) -> dict:
    """The battery at scale through the user's route (see the module doc); returns what the table prints."""
    import json
    import resource

    import reward_lens_spec as rls
    shape = "llama3.1-8b" if cuda else "smoke"
    n, side = (args.scale_pairs, args.scale_tokens) if cuda else (args.pairs, args.side_tokens)
    work = Path(tempfile.mkdtemp(prefix="rl_gpu_scale_"))
    t0 = time.perf_counter()
    # built and saved in a child process, so this process's peak RSS is the run's alone (saving copies every
    # weight to host memory: 16 GB for the 8B shape in bf16)
    child = multiprocessing.get_context("spawn").Process(target=save_model, args=(shape, args.dtype, device,
                                                                                  str(work / "model")))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"building and saving the {shape} model failed (exit code {child.exitcode})")
    saved = time.perf_counter() - t0
    print(f"[gpu.py] {shape} saved in {saved:.0f} s; running the battery on {n} pairs", flush=True)
    with open(work / "pairs.jsonl", "w") as f:
        for p in pairs_of(n, side):
            f.write(json.dumps({"id": p.id, "prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n")
    _peak(device, reset=True)
    t = time.perf_counter()
    h = rls.run([f"model.source={work / 'model'}", f"model.name={shape}", f"model.dtype={args.dtype}",
                 f"model.device={'auto' if cuda else 'cpu'}", "model.device_map=auto", "model.batch_size=auto",
                 f"model.max_length={4 * side}", "dataset=jsonl", f"dataset.path={work / 'pairs.jsonl'}",
                 "observable=battery", f"observable.pairs={args.patch_pairs}", f"store.url={work / 'store.zarr'}",
                 f"store.chunk_pairs={args.chunk_pairs if not cuda else 256}"], progress=cuda)
    _sync(device)
    wall = time.perf_counter() - t
    prov = h.provenance
    counts = prov.get("counts") or {}
    tokens = counts.get("tokens") or counts.get("capture.tokens")
    place = prov.get("placement") or {}
    return {"shape": shape, "pairs": n, "wall": wall, "pps": n / wall, "peak_gpu": _peak(device),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "batch": prov.get("batch_size"),
            "map": place.get("modules_per_place"), "execution": place.get("execution_devices"), "saved_s": saved,
            "tokens_per_side": (tokens / (2 * n)) if tokens else None, "goal": args.goal_s}


def scale_lines(r: dict) -> list[str]:
    met = "met" if r["wall"] <= r["goal"] else "NOT met"
    tps = "n/a" if r["tokens_per_side"] is None else f"{r['tokens_per_side']:.0f}"
    return [f"### battery at scale: {r['shape']}, {r['pairs']} pairs, model.device_map=auto, model.batch_size=auto", "",
            "| wall (s) | pairs/s | peak GPU memory (GiB) | peak RSS (GiB) | batch chosen | modules per place | "
            "runs on | tokens per side | goal |", "|---:|---:|---:|---:|---:|---|---|---:|---|",
            f"| {r['wall']:.1f} | {r['pps']:.1f} | {r['peak_gpu']:.2f} | {r['peak_rss']:.2f} | {r['batch']} | "
            f"{r['map']} | {r['execution']} | {tps} | {r['goal']:.0f} s: {met} |", "",
            f"(model saved as a checkpoint folder first in {r['saved_s']:.0f} s, not counted.)", ""]


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
    ap.add_argument("--scale-only", action="store_true", help="only the at-scale battery (8B shape)")
    ap.add_argument("--scale-pairs", type=int, default=10_000)
    ap.add_argument("--scale-tokens", type=int, default=512)
    ap.add_argument("--goal-s", type=float, default=600.0)
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
    for s in ([] if args.scale_only else shapes):
        results.append(bench_model(s, args, device))   # the model is freed when bench_model returns
        if cuda:
            torch.cuda.empty_cache()
    scale = bench_scale(args, device, cuda)
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
    lines += scale_lines(scale)
    with open(args.out, "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
