"""Self-patching is the identity: ``patch_heads`` and ``path_patch`` give exactly 0 on a pair whose
chosen and rejected sides are identical (as ``patch`` does), on every tiny family, while the other
pairs of the same batch keep their values (issue 26, item 8)."""
from __future__ import annotations

import numpy as np
import pytest

from reward_lens_spec.data import Pair
from tests.conftest import FAMILIES, make_pairs, tiny_lm
from tests.test_battery import run_obs

pytestmark = pytest.mark.usefixtures("one_thread")


def _with_identical(base):
    same = [Pair(id="same0", prompt=base[0].prompt, chosen=base[0].chosen, rejected=base[0].chosen,
                 dimension=base[0].dimension),
            Pair(id="same1", prompt=base[1].prompt, chosen=base[1].rejected, rejected=base[1].rejected,
                 dimension=base[1].dimension)]
    return [base[0], same[0], base[1], same[1], base[2]]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("obs,var", [("examples/head_patch", "patch_effect"),
                                     ("examples/path_patch", "path_patch_effect")])
def test_self_patch_is_exactly_zero(family, obs, var):
    lm = tiny_lm(family)
    base = make_pairs(3)
    mixed = _with_identical(base)
    ds, _ = run_obs(lm, obs, data=mixed)
    ref, _ = run_obs(lm, obs, data=base)
    got = ds[var]
    for pid in ("same0", "same1"):
        vals = got.sel(pair=pid).values
        assert np.all(vals == 0.0), (family, obs, pid, np.abs(vals).max())
    for pid in ("p0", "p1", "p2"):
        a, b = got.sel(pair=pid).values, ref[var].sel(pair=pid).values
        assert np.abs(a).max() > 0
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * (1 + np.abs(b).max()))
