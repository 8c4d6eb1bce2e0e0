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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    X, s, B = planted(a.n, a.d)
    times, cpu, stages, frame = [], [], [], None
    for _ in range(a.repeats):
        c0, t0 = os.times(), time.perf_counter()
        frame = fit_whitened(X, "bench")
        times.append(time.perf_counter() - t0)
        c1 = os.times()
        cpu.append(c1.user + c1.system - c0.user - c0.system)
        stages.append(frame.provenance["models_fit"]["bench"]["timing"])
    med = statistics.median(times)
    U = frame.basis[0]
    dirs = B / np.linalg.norm(B, axis=0)
    planted_var = np.einsum("dk,d,dk->k", dirs, s, dirs) + np.sum((B.T @ dirs) ** 2, axis=0)
    Sig_dirs = frame.direction_to_frame(dirs.T, "bench")   # Σ̂^{1/2} u
    fitted_var = np.sum(Sig_dirs ** 2, axis=1)             # uᵀ Σ̂ u
    ratio = fitted_var / planted_var
    print(f"fit_whitened d={a.d} n={a.n}: median {med:.3f} s over {a.repeats} runs "
          f"({', '.join(f'{t:.3f}' for t in times)}); target < 5 s")
    print(f"  process CPU time median {statistics.median(cpu):.3f} s; load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores (wall time is only meaningful on an otherwise idle machine)")
    print("  stages (s): " + "; ".join(", ".join(f"{k[:-2]} {v:.2f}" for k, v in st.items()) for st in stages))
    print(f"  shrinkage intensity {frame.provenance['models_fit']['bench']['shrinkage_intensity']:.4f}, "
          f"rank {U.shape[1]}, frame id {frame.id[:12]}")
    print(f"  variance along planted spikes, fitted/planted: median {np.median(ratio):.3f} "
          f"(min {ratio.min():.3f}, max {ratio.max():.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
