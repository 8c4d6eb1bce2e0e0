"""Third-party members through Python entry points, loaded only for distributions the user allows
(``plugins.allow``): a real scratch distribution (a ``dist-info`` with ``entry_points.txt`` on ``sys.path``),
no mocks."""
from __future__ import annotations

import importlib
import sys

import pytest

from reward_lens_spec.errors import SpecError
from reward_lens_spec.registries import OPERATORS, _ALLOWED, _norm

DIST, MODULE = "h38-scratch-ops", "h38_scratch_ops"
CODE = '''
from reward_lens_spec.ops.base import NoParams, Operator, need_dim, without


class Flip(Operator):
    """rejected − chosen (pair × objective): a third-party operator."""
    name = "scratch_flip"
    per_pair = True
    Params = NoParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], "side", where, "rejected minus chosen")
        return without(in_dims[0], "side")

    def run(self, ctx, x):
        out = x.sel(side="rejected", drop=True) - x.sel(side="chosen", drop=True)
        out.attrs = {"units": "reward", "gauge": "invariant"}
        return out
'''
OBS = """name: flipped
version: 1
description: a margin from a plugin operator
steps:
  - {name: h, op: capture, site: readout}
  - {name: reward, op: project, input: h, direction: head, bias: true}
  - {name: flip, op: scratch_flip, input: reward}
outputs: [reward, flip]
"""


@pytest.fixture
def scratch_dist(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / MODULE).mkdir(parents=True)
    (site / MODULE / "__init__.py").write_text(CODE)
    info = site / f"{MODULE}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[reward_lens_spec.operators]\nscratch_flip = {MODULE}:Flip\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    (tmp_path / "obs.yaml").write_text(OBS)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    OPERATORS.pop("scratch_flip")
    _ALLOWED.discard(_norm(DIST))
    sys.modules.pop(MODULE, None)


def test_a_plugin_loads_only_when_allowed_and_then_runs_through_the_executor(scratch_dist):
    from reward_lens_spec import api

    over = ["observable=./obs.yaml", f"store.url={scratch_dist / 's.zarr'}", "dataset.limit=3"]
    with pytest.raises(SpecError) as e:
        api.run(over, progress=False)
    msg = str(e.value)
    assert msg == ("observable.flipped.steps.flip.op: operator 'scratch_flip' comes from the Python distribution "
                   f"'{DIST}', whose code is not loaded unless you allow it. Fix: allow it in your config: "
                   f"+plugins.allow=[{DIST}] (configs load no code otherwise).")
    assert MODULE not in sys.modules                       # not allowed: its code never ran
    h = api.run(over + [f"+plugins.allow=[{DIST}]"], progress=False)
    assert MODULE in sys.modules and OPERATORS["scratch_flip"].__module__ == MODULE
    reward, flip = h["reward"], h["flip"]                   # its margin, recomputed by hand from the stored reward
    assert flip.sizes == {"pair": 3}
    assert (flip.values == reward.sel(side="rejected").values - reward.sel(side="chosen").values).all()


def test_allowing_a_distribution_that_is_not_installed_is_one_line(scratch_dist):
    from reward_lens_spec.registries import allow_plugins
    with pytest.raises(SpecError, match=r"^plugins.allow: no installed Python distribution is named 'h38-nothing'"):
        allow_plugins(["h38-nothing"])
    assert "scratch_flip" not in OPERATORS and MODULE not in sys.modules
