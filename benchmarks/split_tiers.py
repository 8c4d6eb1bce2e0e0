"""Write ``tests/slow_in_process.txt`` from a fast-tier run's durations (issue 27 item 6).

The fast tier (``pytest -m "not slow"``) is meant to run in a few minutes after every change. Tests that
start a process are slow by rule (``tests/conftest.py``); this moves the in-process tests that a measured
run found slower than ``--over`` seconds (setup + call + teardown) into the slow tier too, except the fastest
test of each test file, so every test file (and so every module it covers) keeps at least one fast test. CI
runs both tiers, so no test is dropped. Usage::

    python -m pytest -m "not slow" -o addopts="" --durations=0 -p no:cacheprovider > fast.log
    python benchmarks/split_tiers.py fast.log [--over 1.5]
"""
from __future__ import annotations

import argparse
import collections
import re
from datetime import date
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "slow_in_process.txt"
_ROW = re.compile(r"^([0-9.]+)s (call|setup|teardown)\s+(.+?)\s*$")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", help="output of a fast-tier run with --durations=0")
    ap.add_argument("--over", type=float, default=1.5, help="seconds; slower tests move to the slow tier")
    a = ap.parse_args()
    total: dict[str, float] = collections.defaultdict(float)
    for line in Path(a.log).read_text().splitlines():
        m = _ROW.match(line)
        if m:
            total[m.group(3)] += float(m.group(1))
    by_file: dict[str, list] = collections.defaultdict(list)
    for node, s in total.items():
        by_file[node.split("::")[0]].append((s, node))
    moved = []
    for rows in by_file.values():
        rows.sort()
        moved += [(s, n) for s, n in rows[1:] if s > a.over]      # each file's fastest test stays fast
    moved.sort(key=lambda r: r[1])
    kept = sum(total.values()) - sum(s for s, _ in moved)
    head = [f"# In-process tests moved to the slow tier: over {a.over} s in the fast-tier run measured {date.today()}",
            f"# (benchmarks/split_tiers.py; each test file keeps its fastest test fast). {len(moved)} tests, "
            f"{sum(s for s, _ in moved):.0f} s; the fast tier keeps {kept:.0f} s of measured test time.",
            "# Format: node id, then the seconds measured."]
    OUT.write_text("\n".join(head + [f"{n} {s:.2f}" for s, n in moved]) + "\n")
    print(f"{len(moved)} tests -> {OUT} ({sum(s for s, _ in moved):.0f} s moved; {kept:.0f} s stay fast)")


if __name__ == "__main__":
    main()
