"""Preference-structure observables through the console script into a real Zarr store (subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from reward_lens_spec import open_store
from reward_lens_spec.organisms.preference_organisms import cycle_pairs


def cli(cwd, *args):
    exe = Path(sys.executable).parent / "reward-lens-spec"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "reward_lens_spec"]
    return subprocess.run(cmd + list(args), cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OPENBLAS_NUM_THREADS": "1"})


def test_groups_and_votes_mapped_by_dataset_fields_reach_the_store(tmp_path):
    rows = []
    for k, p in enumerate(cycle_pairs(1.0, n_groups=10, noise=0.0)):
        rows.append({"id": p.id, "q": p.prompt, "chosen": p.chosen, "rejected": p.rejected,
                     "set": p.id[:9], "ballots": [1, 1, 1] if k % 2 else [1, 1, 0]})
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    args = ["dataset=jsonl", "dataset.path=p.jsonl", "+dataset.fields.prompt=q", "+dataset.fields.group=set",
            "+dataset.fields.votes=ballots", "store.url=s.zarr"]
    for obs in ("preference_cycles", "contested"):
        res = cli(tmp_path, f"observable={obs}", *args)
        assert res.returncode == 0, res.stderr
    st = open_store(str(tmp_path / "s.zarr"))
    runs = list(st.runs()["run_id"])
    hodge = next(r for r in runs if r.startswith("preference_cycles-"))
    ds = st.load(hodge, "preference_cycles", lazy=False)
    assert sorted(ds["hodge_by_group"].group.values) == sorted({r["set"] for r in rows})
    # every set is a 3-cycle whose edge flows are 2·agreement − 1: (1/3, 1, 1/3) in even sets, (1, 1/3, 1) in odd
    # ones; a cycle (a, b, c) has curl energy (a + b + c)²/3 of a² + b² + c²: 25/33 and 49/57
    ng = ds["hodge_by_group"].sel(flow="labels", hodge_statistic="non_gradient_fraction")
    want = {f"cycle-{g:03d}": (25 / 33 if g % 2 == 0 else 49 / 57) for g in range(10)}
    np.testing.assert_allclose(ng.values, [want[str(g)] for g in ng.group.values], rtol=1e-12)
    assert np.abs(ds["hodge_pooled"].sel(flow="model", hodge_statistic="non_gradient_fraction").values) < 1e-9
    cont = next(r for r in runs if r.startswith("contested-"))
    cd = st.load(cont, "contested", lazy=False)
    gauge = cd["contested_direction"].attrs["gauge"]
    frame_id = gauge.split(":", 2)[2]
    assert any(r == f"frame-{frame_id}" for r in runs)          # the frame every gauge label names is stored
    n = cd["contested_margin"].sel(contested_statistic=["n_contested", "n_unanimous"], bound="estimate").values
    assert list(n) == [15, 15]
