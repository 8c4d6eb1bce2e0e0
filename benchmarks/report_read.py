"""The report's read side on store layout 3 against the same data as one Zarr group per run (issue 27 item 5).

    python benchmarks/bench_report.py --runs 200 --pairs 8          # makes /tmp/rl_bench_report/store.zarr
    python benchmarks/report_read.py [--store /tmp/rl_bench_report/store.zarr] [--repeats 3]

What ``reward-lens-spec report`` reads of every run: its provenance (trust derived from the store's evidence,
read once) and every observable loaded as the report loads it (``Store.load(lazy=LOAD_AT_ONCE)``: each
variable its own group, digests checked). Side by side, alternating, the same provenance work followed by
each run's observables written once (not timed) as ONE group each with plain xarray and read back with
``xr.open_zarr(...).load()`` (layout 2's shape, no digests). Prints the medians and their ratio.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings


def one_group_copy(st, ids, side: str) -> None:
    import xarray as xr

    def obj(a):
        return a.astype(object) if a.dtype.kind in "TUO" else a

    for rid in ids:
        for obs, res in st.load(rid, lazy=False).items():
            parts = {k: obj(v).assign_coords({c: obj(v[c]) for c in v.coords}) for k, v in res.items()}
            one = xr.Dataset(parts, attrs=res.attrs)
            one = one.assign(**{k: v.fillna("") for k, v in one.data_vars.items() if v.dtype == object})
            one = one.assign_coords({k: v.fillna("") for k, v in one.coords.items() if v.dtype == object})
            one.to_zarr(side, group=f"{rid}/{obs}", mode="w-", consolidated=False, zarr_format=3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="/tmp/rl_bench_report/store.zarr")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import xarray as xr

    from reward_lens_spec.report.build import LOAD_AT_ONCE
    from reward_lens_spec.store import open_store

    st = open_store(a.store)
    ids = list(st.runs().run_id)
    side = a.store.rstrip("/") + ".one_group.zarr"
    if not os.path.isdir(side):
        one_group_copy(st, ids, side)
    times: dict[str, list] = {"layout 3": [], "one group": []}
    for _ in range(a.repeats):
        for mode in times:
            t = time.perf_counter()
            s = open_store(a.store)
            ev = s.evidence()
            for rid in ids:
                prov = s.provenance(rid, evidence=ev)
                if mode == "layout 3":
                    s.load(rid, lazy=LOAD_AT_ONCE, verdict=prov)
                else:
                    for obs in prov["observables"]:
                        xr.open_zarr(side, group=f"{rid}/{obs}", consolidated=False).load()
            times[mode].append(time.perf_counter() - t)
    m = {k: statistics.median(v) for k, v in times.items()}
    print(f"| runs | layout 3 (median of {a.repeats}) | one group per run | ratio (target ≤ 1.2×) | load average |")
    print("|---|---|---|---|---|")
    print(f"| {len(ids)} | {m['layout 3']:.2f} s | {m['one group']:.2f} s | **{m['layout 3'] / m['one group']:.2f}×** "
          f"| {', '.join(f'{x:.1f}' for x in os.getloadavg())} |")


if __name__ == "__main__":
    main()
