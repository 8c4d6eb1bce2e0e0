"""Benchmark: fit a whitened frame at d = 4096 from n = 2,000 activations (target < 5 s).

Data: random activations with a planted covariance Σ = diag(s) + B Bᵀ (power-law diagonal
s_i = i^{-0.5}, plus k = 16 spikes B of norm ~ 3·√d), drawn as x = z₁ √s + z₂ Bᵀ. Prints the median
of ``--repeats`` wall times of ``fit_whitened`` (Ledoit–Wolf shrinkage, spectral form; no d × d
matrix is formed because n < d), the shrinkage intensity, and a check of the fit: the fitted
variance along each planted spike direction relative to the planted one.

Usage: ``python benchmarks/bench_frames.py [--d 4096] [--n 2000] [--repeats 3]``. Also prints the
process CPU time (load-independent with ``OPENBLAS_NUM_THREADS=1``) and a per-stage split.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from reward_lens_spec.frames import fit_whitened


def planted(n: int, d: int, k: int = 16, seed: int = 0):
    rng = np.random.Generator(np.random.PCG64(seed))
    s = np.arange(1, d + 1) ** -0.5
    B = rng.standard_normal((d, k)) * 3.0
    X = rng.standard_normal((n, d)) * np.sqrt(s) + rng.standard_normal((n, k)) @ B.T
    return X, s, B


def measure(d: int = 4096, n: int = 2000, repeats: int = 3) -> dict:
    """Time ``fit_whitened`` on planted data; wall and CPU seconds per run, stages, and the fit check."""
    X, s, B = planted(n, d)
    times, cpu, stages, frame = [], [], [], None
    for _ in range(repeats):
        c0, t0 = os.times(), time.perf_counter()
        frame = fit_whitened(X, "bench")
        times.append(time.perf_counter() - t0)
        c1 = os.times()
        cpu.append(c1.user + c1.system - c0.user - c0.system)
        stages.append(frame.provenance["models_fit"]["bench"]["timing"])
    dirs = B / np.linalg.norm(B, axis=0)
    planted_var = np.einsum("dk,d,dk->k", dirs, s, dirs) + np.sum((B.T @ dirs) ** 2, axis=0)
    fitted_var = np.sum(frame.direction_to_frame(dirs.T, "bench") ** 2, axis=1)     # uᵀ Σ̂ u
    fit = frame.provenance["models_fit"]["bench"]
    return {"d": d, "n": n, "times": times, "wall": statistics.median(times), "cpu": statistics.median(cpu),
            "stages": stages, "rho": fit["shrinkage_intensity"], "rank": int(frame.basis[0].shape[1]),
            "frame_id": frame.id, "spike_ratio": fitted_var / planted_var, "load": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    m = measure(a.d, a.n, a.repeats)
    r = m["spike_ratio"]
    print(f"fit_whitened d={a.d} n={a.n}: median {m['wall']:.3f} s over {a.repeats} runs "
          f"({', '.join(f'{t:.3f}' for t in m['times'])}); target < 5 s")
    print(f"  process CPU time median {m['cpu']:.3f} s; load average {m['load']:.2f} "
          f"on {os.cpu_count()} cores (wall time is only meaningful on an otherwise idle machine)")
    print("  stages (s): " + "; ".join(", ".join(f"{k[:-2]} {v:.2f}" for k, v in st.items()) for st in m["stages"]))
    print(f"  shrinkage intensity {m['rho']:.4f}, rank {m['rank']}, frame id {m['frame_id'][:12]}")
    print(f"  variance along planted spikes, fitted/planted: median {np.median(r):.3f} "
          f"(min {r.min():.3f}, max {r.max():.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
