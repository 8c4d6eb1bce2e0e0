"""How tests/data/store_layout3.tar.gz was made: store layout 3, written by main's writer at commit 636a208
(``PYTHONPATH=<main checkout> python make_store_layout3.py store_layout3.zarr``, then ``tar czf``).
Not run by the tests: the package here writes layout 4."""
import sys, shutil, os
import numpy as np, xarray as xr
out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True)
import reward_lens_spec
assert reward_lens_spec.__file__.startswith("/work/main/"), reward_lens_spec.__file__
from reward_lens_spec.store import write_run, LAYOUT_VERSION
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.attempts import Attempt
from reward_lens_spec.result import Result
assert LAYOUT_VERSION == 3
rng = np.random.default_rng(0)
pair = [f"p{i}" for i in range(4)]
labels = {"dimension": ("pair", ["helpful", "harmless", "honest", "helpful"]),
          "prompt_id": ("pair", ["q0", "q0", "q1", "q2"]), "empty_response": ("pair", [False, False, True, False])}
lens = xr.Dataset({"raw": (("pair", "layer"), rng.normal(size=(4, 3)), {"units": "reward", "gauge": "invariant"})},
                  coords={"pair": pair, "layer": [-1, 0, 1], **labels}, attrs={"observable": "lens"})
score = xr.Dataset({"margin": ("pair", rng.normal(size=4), {"units": "reward", "gauge": "invariant"}),
                    "reward": (("pair", "side"), rng.normal(size=(4, 2)), {"units": "reward"})},
                   coords={"pair": pair, "side": ["chosen", "rejected"], **labels})
c = {"pair": pair, **labels}
dla = xr.DataArray(rng.normal(size=(4, 4, 3)), dims=("pair", "layer", "component"),
                   coords={**c, "layer": [-1, 0, 1, 2], "component": ["embed", "attn", "mlp"]},
                   attrs={"units": "reward", "gauge": "invariant"})
patch = xr.DataArray(rng.normal(size=(4, 3, 3)), dims=("pair", "layer", "component"),
                     coords={**c, "layer": [0, 1, 2], "component": ["resid", "attn", "mlp"]},
                     attrs={"units": "reward", "gauge": "invariant"})
margin = xr.DataArray(rng.normal(size=4), dims="pair", coords=c, attrs={"units": "reward"})
attrs = {"model": "tiny", "model_fingerprint": "fp0", "dataset": "diag", "config_yaml": "seed: 0\n"}
assert write_run(out, "r0", {"lens": lens, "score": score}, attrs)
assert write_run(out, "r1", {"battery": Result({"margin": margin, "dla": dla, "patch_effect": patch})}, attrs)
att = Attempt.create(Backend(out), "crashed", {"kind": "write"}, role="write")   # a writer that never completed
att.release("write"); att.close()
print("ok", sorted(os.listdir(out)))
