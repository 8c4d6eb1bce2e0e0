"""``store migrate`` dying at each store write it makes, then run again: the store must end migrated with every
run readable and verified, or the run again refuses with one line; never a run listed over missing data.

The death is planted in process at the k-th call of one step (as ``test_forced_replacement`` plants them), for
every k until the migration gets through. The dead migrate's leases are then those of a process that is gone
(``pid_alive`` false), as they are after a real death on this host.
"""
from __future__ import annotations

import os
import re
import shutil
import warnings

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store import LAYOUT_VERSION, leases, migrate, migration, open_store
from reward_lens_spec.store import publish as publication
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.attempts import PUBLISH, Attempt
from test_forced_replacement import Died, _dies_after, _root_runs
from test_store_plain import _layout3_values, _old, plain_tree

# (owner, function): each step of ``migrate`` that writes to the store
STEPS = [(migration, "_move"), (migration, "publish_group"), (publication, "_copy"), (migration, "consolidate"),
         (Backend, "write_atomic"), (Backend, "remove_tree"), (Backend, "create_exclusive"), (os, "rename"),
         (os, "link")]


def _listed_runs_read_whole(url) -> None:
    """Whatever a reader lists now reads whole: the package's listing (once the layout is current) and the
    root's consolidated metadata (what plain readers use)."""
    try:
        st = open_store(url)
    except StoreError as e:
        assert "store migrate" in str(e)               # still the old layout: refused, nothing listed
        return
    for rid in st.runs().run_id:
        assert st.verify(rid)["status"] == "verified", rid
    with warnings.catch_warnings():                    # a root without consolidated metadata yet: xarray warns
        warnings.simplefilter("ignore")
        tree = xr.open_datatree(url, engine="zarr")
    for rid in _root_runs(url):
        for obs in tree[f"runs/{rid}"].children:
            tree[f"runs/{rid}/{obs}"].to_dataset().load()


def _migrated_whole(url, before: dict) -> None:
    st = open_store(url)
    assert sorted(st.runs().run_id) == ["r0", "r1"]
    tree = plain_tree(url)
    for (run, obs, var), values in before.items():
        np.testing.assert_array_equal(st.load(run, obs, lazy=False)[var].values, values)
        np.testing.assert_array_equal(tree[f"runs/{run}/{obs}"].to_dataset()[var].values, values)
    for run in ("r0", "r1"):
        assert st.verify(run)["status"] == "verified", run


@pytest.mark.parametrize("owner,name", STEPS, ids=[n for _, n in STEPS])
def test_migrate_dying_at_each_write_then_migrating_again_ends_whole(tmp_path, monkeypatch, owner, name):
    pristine = _old(tmp_path / "orig")
    before = _layout3_values(pristine)
    for after in range(100):
        url = str(tmp_path / f"k{after}")
        shutil.copytree(pristine, url)
        monkeypatch.setattr(owner, name, _dies_after(getattr(owner, name), after, name))
        try:
            migrate(url)
        except (Died, StoreError):
            pass
        else:
            break                                      # got through: every step of this kind was tried
        finally:
            monkeypatch.undo()
        _listed_runs_read_whole(url)
        with monkeypatch.context() as m:
            m.setattr(leases, "pid_alive", lambda pid: False)     # the dying migrate's process is gone
            assert migrate(url) == LAYOUT_VERSION, (name, after)
        _migrated_whole(url, before)
    else:
        pytest.fail(f"{name}: migrate never got through")
    assert after > 0                                   # the step was met at least once


def test_migrate_refuses_while_another_process_holds_a_runs_publish_lease(tmp_path):
    """A complete run still to be published whose ``publish`` lease another process holds (a second migrate,
    or one killed on another host less than the lease time ago): migrate used to skip it and stamp the layout,
    listing the run over unpublished data (``GroupNotFoundError`` on load). It refuses in one line instead,
    before the layout changes, and migrates whole once the lease is released."""
    url = _old(tmp_path)
    before = _layout3_values(url)
    holder = Attempt(Backend(url), "r0", PUBLISH, {})
    assert holder.claim("publish")
    try:
        with pytest.raises(StoreError, match="run r0 is complete but not yet published") as e:
            migrate(url)
        assert "\n" not in str(e.value) and "Fix: run store migrate again" in str(e.value)
        with pytest.raises(StoreError, match="store migrate"):
            open_store(url)                            # the layout was not stamped: nothing is listed
    finally:
        holder.release("publish")
        holder.close()
    assert migrate(url) == LAYOUT_VERSION
    _migrated_whole(url, before)


@pytest.mark.parametrize("step", ["cp_file", "rm_file"])
def test_migrate_on_an_object_store_dying_mid_move_then_again_moves_whole(tmp_path, monkeypatch, step):
    """On object stores a folder is moved object by object. ``fs.mv`` interrupted, then run again into the
    ``dst`` it had begun, nested the source inside it (``_internal/log/log/…``, ``<attempt>/<attempt>/…``):
    the run was then listed over data no reader finds (``GroupNotFoundError``), log entries lost to the
    chain. Planted here on ``memory://`` at the k-th object copied or removed, every 7th k up to every
    object of the store."""
    import fsspec

    local = _old(tmp_path)
    before = _layout3_values(local)
    log = sorted(os.listdir(os.path.join(local, "log")))
    mem = fsspec.filesystem("memory")
    n = sum(len(files) for _, _, files in os.walk(local))
    for after in range(0, 2 * n, 7):
        url = f"memory://migrate-{step}-{after}.zarr"
        mem.put(local + "/", url[len("memory://"):], recursive=True)
        monkeypatch.setattr(type(mem), step, _dies_after(getattr(type(mem), step), after, step))
        try:
            migrate(url)
        except (Died, StoreError):
            pass
        else:
            break
        finally:
            monkeypatch.undo()
        with monkeypatch.context() as m:
            m.setattr(leases, "pid_alive", lambda pid: False)
            assert migrate(url) == LAYOUT_VERSION, (step, after)
        keys = mem.find(url[len("memory://"):])
        assert not [k for k in keys if re.search(r"/(log|attempt-[0-9a-f]+)/\1/", k)], (step, after)   # nested
        assert sorted(k.rsplit("/", 1)[-1] for k in keys if "/_internal/log/" in k) == log, (step, after)
        _migrated_whole(url, before)
    else:
        pytest.fail(f"{step}: migrate never got through")


def _attempt_of(url, run) -> str:
    import json
    return json.load(open(os.path.join(url, "runs", run, "zarr.json")))["attributes"]["attempt"]


@pytest.mark.parametrize("layout", [3, 4])
def test_migrate_refuses_a_complete_run_whose_observable_is_gone(tmp_path, layout):
    """A complete run one of whose observables is neither published from the attempt its document names nor held
    by that attempt (its folder removed): migrate used to skip it silently and stamp the layout, listing the run
    over data no reader finds. It refuses in one line naming the run and the observable, the layout unstamped
    (layout 3) or the store as it was (layout 4); once the run's folder is removed, it migrates the rest whole."""
    url = _old(tmp_path)
    before = _layout3_values(url)
    obs = "score"                                      # r0 holds lens and score: score goes, lens stays
    aid = _attempt_of(url, "r0")
    if layout == 3:
        shutil.rmtree(os.path.join(url, "runs", "r0", aid, obs))
    else:
        assert migrate(url) == LAYOUT_VERSION
        shutil.rmtree(os.path.join(url, "_internal", "attempts", "r0", aid, obs))
        shutil.rmtree(os.path.join(url, "runs", "r0", obs))
    with pytest.raises(StoreError, match=f"run r0 is complete, but its observable '{obs}' is neither published") as e:
        migrate(url)
    assert "\n" not in str(e.value) and "Fix: remove the folders runs/r0 and _internal/attempts/r0" in str(e.value)
    if layout == 3:
        with pytest.raises(StoreError, match="store migrate"):
            open_store(url)                            # not stamped: nothing is listed over the missing data
    shutil.rmtree(os.path.join(url, "runs", "r0"))
    shutil.rmtree(os.path.join(url, "_internal", "attempts", "r0"), ignore_errors=True)   # layout 3: moved by
    assert migrate(url) == LAYOUT_VERSION                                                  # the migrate above
    st = open_store(url)
    assert sorted(st.runs().run_id) == ["r1"] and st.verify("r1")["status"] == "verified"
    for (run, o, var), values in before.items():
        if run == "r1":
            np.testing.assert_array_equal(st.load(run, o, lazy=False)[var].values, values)


def test_following_migrates_fix_lets_the_study_run_again(tmp_path):
    """The one-line refusal's Fix, followed as written on a store a real run made, ends with the study run again:
    recomputed (the run's old attempt, which lost the observable, is not resumed) and read whole."""
    import reward_lens_spec as rls

    url = str(tmp_path / "s.zarr")
    args = ["observable=score", "dataset.limit=4", f"store.url={url}"]
    first = rls.run(args, progress=False)
    want = first["margin"].values
    run = first.run_id
    aid = _attempt_of(url, run)
    shutil.rmtree(os.path.join(url, "_internal", "attempts", run, aid, "score"))
    shutil.rmtree(os.path.join(url, "runs", run, "score"))
    with pytest.raises(StoreError) as e:
        migrate(url)
    fix = str(e.value).split("Fix: remove the folders ", 1)[1].split(" from the store")[0].split(" and ")
    for folder in fix:
        shutil.rmtree(os.path.join(url, folder))
    assert migrate(url) == LAYOUT_VERSION
    again = rls.run(args, progress=False)
    assert again.run_id == run and not again.reused
    np.testing.assert_array_equal(open_store(url).load(run, "score", lazy=False)["margin"].values, want)
    assert open_store(url).verify(run)["status"] == "verified"
