"""Section 4: wall time and peak RSS against the number of pairs (a fresh process per size), and
store write/read throughput."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import builtin_or_1b, diagnostic_pairs, forwards, load_folder, med, run_obs

RUN = Path(__file__).resolve().parent / "run.py"


def store_throughput(work: Path, n: int, repeats: int = 3) -> list:
    """Write/read MB/s of two results shaped for SmolLM2 (30 layers, 9 heads, d 576) and ``n`` pairs:
    the battery's outputs, and per-pair residuals (pair × side × layer × d_model, float32); side by side,
    the same Dataset written to and read from one group with plain xarray (store layout 2's data write)."""
    import shutil

    import numpy as np
    import xarray as xr

    from reward_lens_spec.store import open_store, write_run
    rng = np.random.default_rng(0)
    L, H, d = 30, 9, 576
    c = {"pair": [f"p{i:05d}" for i in range(n)], "side": ["chosen", "rejected"], "layer": np.arange(-1, L),
         "component": ["embed", "attn", "mlp"], "head": np.arange(H), "d_model": np.arange(d)}
    f = lambda *dims: (dims, rng.standard_normal([len(c[x]) for x in dims]).astype(np.float32))  # noqa: E731
    battery = xr.Dataset({"reward": f("pair", "side"), "margin": f("pair"), "lens": f("pair", "layer"),
                          "lens_raw": f("pair", "layer"), "dla": f("pair", "layer", "component"),
                          "dla_heads": f("pair", "layer", "head"), "patch_effect": f("pair", "layer", "component"),
                          "patch_restored": f("pair", "layer", "component"),
                          "attribution_patch_effect": f("pair", "layer", "component")},
                         coords={k: c[k] for k in ("pair", "side", "layer", "component", "head")})
    resid = xr.Dataset({"resid": f("pair", "side", "layer", "d_model")},
                       coords={k: c[k] for k in ("pair", "side", "layer")})
    from reward_lens_spec.store._attrs import portable
    rows = []
    for what, ds in ((f"battery outputs, {n} pairs", battery), (f"residuals {n}×2×31×576 f32", resid)):
        url = work / "store_bench.zarr"
        shutil.rmtree(url, ignore_errors=True)
        tw, tr, ow, orr = [], [], [], []
        for i in range(repeats):
            t0 = time.perf_counter()
            write_run(str(url), f"bench-{i}", {"bench": ds}, {"note": "benchmark"})
            tw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            back = open_store(str(url)).load(f"bench-{i}", "bench", lazy=False)
            tr.append(time.perf_counter() - t0)
            # side by side: the whole Dataset in one group, as store layout 2 wrote it (no run document)
            t0 = time.perf_counter()
            portable(ds).to_zarr(str(url), group=f"one/bench-{i}", mode="w", consolidated=False, zarr_format=3)
            ow.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            xr.open_zarr(str(url), group=f"one/bench-{i}", consolidated=False).load()
            orr.append(time.perf_counter() - t0)
        assert float(abs(back[next(iter(ds.data_vars))] - ds[next(iter(ds.data_vars))]).max()) == 0.0
        mb = ds.nbytes / 1e6
        rows.append({"what": what, "mb": mb, "write_s": med(tw), "read_s": med(tr),
                     "write_mbs": mb / med(tw), "read_mbs": mb / med(tr), "variables": len(ds.data_vars),
                     "one_write_s": med(ow), "one_read_s": med(orr), "write_ratio": med(tw) / med(ow),
                     "read_ratio": med(tr) / med(orr), "load": [round(x, 2) for x in os.getloadavg()]})
        shutil.rmtree(url, ignore_errors=True)
    return rows


def _status_mb(key: str) -> float:
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key)) / 1024


def scaling_child(n: int, batch_size: int, device: str, model: str, repeats: int) -> int:
    """One size, in its own process: warm-up on 8 pairs, then ``repeats`` timed battery runs on ``n``.
    Peak RSS: ``resource.getrusage`` (whole process) and VmHWM after resetting it (``/proc/self/clear_refs``)
    just before the timed runs, i.e. the peak while computing."""
    import resource
    lm = load_folder("rl_tiny", Path(model), device, attn="eager") if os.sep in model else builtin_or_1b(model, device)
    pairs = diagnostic_pairs(n)
    run_obs(lm, pairs[:8], "battery", batch_size)
    rss0 = _status_mb("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")
        hwm_reset = True
    except OSError:
        hwm_reset = False
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ds, ctx = run_obs(lm, pairs, "battery", batch_size)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"n": n, "batch_size": batch_size, "wall": med(times), "times": times, "rss_before_mb": rss0,
                      "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "compute_peak_mb": _status_mb("VmHWM") if hwm_reset else float("nan"),
                      "forwards": forwards(ctx)}))
    return 0


def scaling_runs(args, model: str) -> list:
    """Section 3: each size in a fresh subprocess. Run before this process loads big models: on Linux a
    child's ``ru_maxrss`` starts from the parent's RSS at fork (it survives exec)."""
    sizes = [64, 128, 256] if args.quick else [64, 128, 256, 512, 1024]
    out = []
    for n in sizes:
        cmd = [sys.executable, str(RUN), "--_scale-child", str(n), "--batch-size", str(args.batch_size),
               "--device", args.device, "--threads", str(args.threads), "--repeats", str(args.repeats),
               "--_scale-model", model]
        r = subprocess.run(cmd, capture_output=True, text=True)
        try:
            out.append({**json.loads(r.stdout.strip().splitlines()[-1]), "model": model})
        except (IndexError, json.JSONDecodeError):
            out.append({"n": n, "error": r.stderr.strip().splitlines()[-1:]})
    return out
