"""Issue 39 item 2: a study from Python on the one path. ``reward_lens_spec.run`` composes with the command
line's checks, executes through ``run.executor.execute`` (same run id, reuse found), and hands back labelled
xarray results, small ones in memory."""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

import reward_lens_spec as rls
from reward_lens_spec.api import to_overrides
from reward_lens_spec.errors import SpecError


def test_dict_overrides_become_the_command_lines_list():
    got = to_overrides({"model": "tiny", "observable": {"name": "x", "layers": [1, 3]}, "dataset": {"limit": 20},
                        "store": {"force": True, "url": "a b.zarr"}, "seed": None})
    assert got == ["model=tiny", "observable.name=x", "observable.layers=[1,3]", "dataset.limit=20",
                   "store.force=true", "store.url='a b.zarr'", "seed=null"]
    assert to_overrides(["observable=dla"]) == ["observable=dla"] and to_overrides(None) == []


@pytest.mark.parametrize("bad", ["observable=dla", 3, [1, 2], {"observable": object()}.keys()])
def test_anything_but_a_list_of_strings_or_a_dict_is_one_line_naming_overrides(bad):
    with pytest.raises(SpecError) as e:
        to_overrides(bad)
    assert str(e.value).startswith("overrides:") and "\n" not in str(e.value)


def test_a_typo_gets_the_command_lines_did_you_mean(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="Did you mean 'score'"):
        rls.run(["observable=scroe"])


def test_run_from_python_is_the_command_lines_run_and_reuses_it(tmp_path, monkeypatch):
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run.executor import execute

    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        h = rls.run({"observable": "score", "dataset": {"limit": 6}})
        cfg, text = compose_run(["observable=score", "dataset.limit=6"])
        direct = execute(cfg, resolved_yaml=text, base_dir=str(tmp_path),
                         store_url=str(tmp_path / "outputs" / "store.zarr"), progress=False)
        again = rls.run(["observable=score", "dataset.limit=6"])
    assert not h.reused and direct.reused and again.reused
    assert direct.run_id == h.run_id == again.run_id
    margin = h["margin"]
    assert margin.dims == ("pair",) and "dimension" in margin.coords
    assert isinstance(margin.data, np.ndarray)               # small: in memory, .item() works
    reward = h["reward"].values
    assert np.allclose(margin.values, reward[:, 0] - reward[:, 1], rtol=0, atol=1e-6)
    assert h.trust == "exploratory" and h.provenance["run_id"] == h.run_id
