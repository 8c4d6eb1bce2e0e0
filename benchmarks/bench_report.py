"""The one-page HTML store report on a store of many small runs (target: 200 runs in < 60 s).

    python benchmarks/bench_report.py [--runs 200] [--pairs 8] [--work /tmp/rl_bench_report]

Setup (not timed): one real ``battery`` and one real ``confounders`` run of the built-in tiny model
(``dataset.limit=--pairs``) are computed; their stored Datasets are then written ``--runs`` times in
all (alternating observables) under new run ids, with the margins, lens and attributions scaled by a
per-run factor and the model names cycling over four, so every run is a distinct small result with
real shapes and provenance. Timed: ``report.build.build_report`` over the whole store, in a fresh
subprocess (imports included), once, as ``reward-lens-spec report`` runs it. Prints a markdown block.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import xarray as xr

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TIMED = ("import sys, time; t, c = time.perf_counter(), time.process_time(); "
         "from reward_lens_spec.report.build import build_report; p = build_report(sys.argv[1], sys.argv[2]); "
         "print(time.perf_counter() - t, time.process_time() - c, p.stat().st_size)")


def make_store(work: Path, n_runs: int, n_pairs: int) -> str:
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run import execute
    from reward_lens_spec.result import Result
    from reward_lens_spec.store import open_store, write_run
    from reward_lens_spec.store.writer import RESERVED

    seed_url, url = str(work / "seed.zarr"), str(work / "store.zarr")
    sources = []
    for obs in ("battery", "confounders"):
        run, text = compose_run(["model=tiny", f"observable={obs}", f"dataset.limit={n_pairs}"])
        rid = execute(run, resolved_yaml=text, base_dir=str(work), store_url=seed_url, progress=False).run_id
        st = open_store(seed_url)
        prov = {k: v for k, v in st.provenance(rid).items() if k not in RESERVED}
        sources.append((obs, st.load(rid, obs, lazy=False), prov))
    scaled = ("margin", "lens", "lens_raw", "dla", "dla_heads", "patch_effect", "reward", "attribution_patch_effect")
    for i in range(n_runs):
        obs, ds, prov = sources[i % 2]
        f = 0.5 + (i % 17) / 8
        with xr.set_options(keep_attrs=True):                  # units and gauge stay on scaled variables
            ds = Result({**ds, **{v: ds[v] * f for v in scaled if v in ds}}, ds.attrs)
        attrs = {**prov, "model": f"tiny-{'abcd'[i % 4]}", "spec_hash": f"{prov['spec_hash'][:40]}{i:024d}"}
        write_run(url, f"{obs}-bench-{i:04d}", {obs: ds}, attrs)
    return url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rl_bench_report"))
    ap.add_argument("--reuse", action="store_true", help="time the report on the store a previous run left")
    a = ap.parse_args()
    t0 = time.perf_counter()
    if a.reuse and (a.work / "store.zarr").is_dir():
        url, setup = str(a.work / "store.zarr"), None
    else:
        shutil.rmtree(a.work, ignore_errors=True)
        a.work.mkdir(parents=True)
        url = make_store(a.work, a.runs, a.pairs)
        setup = time.perf_counter() - t0
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    load = os.getloadavg()
    out = subprocess.run([sys.executable, "-c", TIMED, url, str(a.work / "report")], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    wall, cpu, size = float(out[0]), float(out[1]), int(out[2])
    verdict = "**met**" if wall < 60 else "**missed**"
    print(f"## 6. HTML store report (`reward-lens-spec report url=STORE out=DIR`, {a.runs} runs)\n")
    print(f"Reproduce: `python benchmarks/bench_report.py --runs {a.runs} --pairs {a.pairs}`. Machine: "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average before the timed "
          f"run {tuple(round(x, 2) for x in load)}; python {platform.python_version()}.\n")
    print("| runs | pairs per run | report wall (fresh process, imports included) | process CPU | per run (wall) "
          "| page size | target |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {a.runs} | {a.pairs} | {wall:.1f} s | {cpu:.1f} s | {1000 * wall / a.runs:.0f} ms | "
          f"{size / 1e6:.1f} MB | < 60 s: {verdict} |")
    print(f"\nRuns alternate battery (lens, DLA and patch grids, crystallization histogram, per-pair table) and "
          f"confounders (three confounder plots, length scatter); store setup (not timed): "
          f"{'reused' if setup is None else f'{setup:.0f} s'}. Timed once (one run of the benchmark).")


if __name__ == "__main__":
    main()
