"""A forced rewrite of a complete run that dies while replacing its published groups: the run must end absent,
never listed over missing data or over another writer's (``store.completion``: unlist, then replace, then list).

Found by ``test_writers.test_two_writers_of_one_run_id_killed_at_random_points`` (a victim SIGKILLed after it
had begun replacing the survivor's publication: ``GroupNotFoundError`` / a ``pair`` digest mismatch on the
listed run). Here the death is planted at each step of the publication in turn, in process.
"""
from __future__ import annotations

import json

import pytest
import xarray as xr

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store import open_store, write_run
from reward_lens_spec.store import publish as publication
from reward_lens_spec.store._backend import Backend
from test_store import assert_same, make_attrs, make_results


class Died(Exception):
    """Stands for the process dying at this point (nothing after it runs)."""


def _dies_after(real, after: int, name: str):
    """``real`` let through ``after`` times, then raising ``Died(name)`` (the process dying at that call)."""
    calls = []

    def dying(*a, **k):
        calls.append(1)
        if len(calls) > after:
            raise Died(name)
        return real(*a, **k)
    return dying


def _root_runs(url) -> set[str]:
    """Run ids the root's consolidated metadata lists (what plain xarray readers see)."""
    meta = (Backend(url).read_json("zarr.json") or {}).get("consolidated_metadata", {}).get("metadata", {})
    return {k.split("/")[1] for k in meta if k.startswith("runs/") and k.count("/") >= 1}


# each step of a forced publication at which the writer dies: (function of store.publish, calls let through)
STEPS = [("publish", 0), ("publish_group", 0), ("publish_group", 1), ("_copy", 0), ("_copy", 1)]


@pytest.mark.parametrize("name,after", STEPS)
def test_a_forced_rewrite_dying_while_it_publishes_leaves_the_run_absent(tmp_path, monkeypatch, name, after):
    url = str(tmp_path / "s.zarr")
    assert write_run(url, "r", make_results(0), make_attrs(0))
    monkeypatch.setattr(publication, name, _dies_after(getattr(publication, name), after, name))
    with pytest.raises((Died, StoreError)):
        write_run(url, "r", make_results(1), make_attrs(1), force=True)
    monkeypatch.undo()
    store = open_store(url)
    assert list(store.runs().run_id) == []                  # absent: not listed over missing or mixed data
    assert "r" not in _root_runs(url)                       # and plain readers' metadata does not list it
    with pytest.raises(StoreError):
        store.load("r", "lens")
    assert write_run(url, "r", make_results(2), make_attrs(2))   # the same run id can be written again, whole
    store = open_store(url)
    assert store.provenance("r")["seed"] == 2
    for obs, want in make_results(2).items():
        assert_same(store.load("r", obs), want)
        assert_same(xr.open_datatree(url, engine="zarr")[f"runs/r/{obs}"].to_dataset(), want)


def test_a_forced_rewrite_that_completes_replaces_the_run_whole(tmp_path):
    """The unlisting step changes nothing when the forced writer finishes: the new run is listed, whole, and
    the root's metadata names it."""
    url = str(tmp_path / "s.zarr")
    assert write_run(url, "r", make_results(0), make_attrs(0))
    assert write_run(url, "r", make_results(1), make_attrs(1), force=True)
    store = open_store(url)
    assert list(store.runs().run_id) == ["r"] and store.provenance("r")["seed"] == 1
    for obs, want in make_results(1).items():
        assert_same(store.load("r", obs), want)
    assert "r" in _root_runs(url)
    assert json.loads(Backend(url).read("runs/r/zarr.json"))["attributes"]["complete"] is True


def test_a_forced_rewrite_dying_before_the_root_drops_the_run_then_a_dying_writer_leave_it_unlisted(
        tmp_path, monkeypatch):
    """The forced writer dies after emptying the run document, before the root's metadata drops the run; the
    next writer (the run is incomplete now: no force needed) dies while it publishes. Plain readers' metadata
    must not list the run over the groups the second writer removed or half replaced."""
    url = str(tmp_path / "s.zarr")
    assert write_run(url, "r", make_results(0), make_attrs(0))
    real_consolidate, real_copy = publication.consolidate, publication._copy

    def died(*a, **k):
        raise Died("consolidate")

    monkeypatch.setattr(publication, "consolidate", died)
    with pytest.raises((Died, StoreError)):
        write_run(url, "r", make_results(1), make_attrs(1), force=True)
    monkeypatch.setattr(publication, "consolidate", real_consolidate)

    monkeypatch.setattr(publication, "_copy", _dies_after(real_copy, 1, "_copy"))
    with pytest.raises((Died, StoreError)):
        write_run(url, "r", make_results(2), make_attrs(2))
    monkeypatch.undo()
    assert list(open_store(url).runs().run_id) == []
    assert "r" not in _root_runs(url)


def test_a_completion_consolidating_late_never_relists_a_run_a_forced_writer_unlisted(tmp_path, monkeypatch):
    """Writer A completes the run; a forced writer B starts while A's consolidated-metadata update is under way,
    unlists the run and dies while it replaces the groups. A's update must not list the run again (its document
    is empty, its groups half removed): A updates the metadata under the run's publish lease, so B waits for it
    (B is given 2 s to get in first, which is where main let it)."""
    import threading

    url = str(tmp_path / "s.zarr")
    real_consolidate, real_copy = publication.consolidate, publication._copy
    forced, calls = [], []

    def dying_copy(*a, **kw):
        if threading.current_thread() is not threading.main_thread():
            calls.append(1)
            if len(calls) > 1:
                raise Died("_copy")
        return real_copy(*a, **kw)

    def forced_write():
        try:
            forced.append(write_run(url, "r", make_results(1), make_attrs(1), force=True))
        except Died:
            forced.append("died")

    b_writer = threading.Thread(target=forced_write)

    def late_consolidate(b, run_ids=(), **k):
        if k.get("known") and threading.current_thread() is threading.main_thread() and not b_writer.is_alive() \
                and not forced:                     # A's update, after its run document is written
            b_writer.start()
            b_writer.join(2)
        return real_consolidate(b, run_ids, **k)

    monkeypatch.setattr(publication, "_copy", dying_copy)
    monkeypatch.setattr(publication, "consolidate", late_consolidate)
    assert write_run(url, "r", make_results(0), make_attrs(0))
    b_writer.join(120)
    monkeypatch.undo()
    assert forced == ["died"]
    assert list(open_store(url).runs().run_id) == []
    assert "r" not in _root_runs(url)


def test_another_runs_late_consolidation_never_relists_a_run_a_forced_writer_unlisted(tmp_path, monkeypatch):
    """C brings the root up to date for run s and stalls after reading the root; forced writer B empties run
    r's document and must wait for the root lease C holds before it unlists r; C is then let go (its write
    still lists r), B unlists r after it and dies while it replaces r's groups. r must end listed nowhere
    (plain readers would read B's half publication under r's old metadata: score all NaN)."""
    import threading

    from reward_lens_spec.store.attempts import Attempt

    url = str(tmp_path / "s.zarr")
    assert write_run(url, "r", make_results(0), make_attrs(0))
    assert write_run(url, "s", make_results(3), make_attrs(3))
    read, go, waiting = threading.Event(), threading.Event(), threading.Event()
    real_read, real_claim, copies, forced = Backend.read_json, Attempt.claim, [], []
    dying_copy = _dies_after(publication._copy, 1, "_copy")

    def read_json(self, key):
        out = real_read(self, key)
        if key == "zarr.json" and threading.current_thread().name == "C" and not read.is_set():
            read.set()                              # C holds the root lease here
            assert go.wait(60)
        return out

    def claim(self, role):
        got = real_claim(self, role)
        if role == "root" and not got and threading.current_thread().name == "B":
            waiting.set()                           # B's consolidate waits for C's lease
        return got

    def copy(*a, **k):
        copies.append(1)
        return dying_copy(*a, **k)

    def forced_write():
        try:
            forced.append(write_run(url, "r", make_results(1), make_attrs(1), force=True))
        except (Died, StoreError) as e:
            forced.append(type(e).__name__)

    monkeypatch.setattr(Backend, "read_json", read_json)
    monkeypatch.setattr(Attempt, "claim", claim)
    c = threading.Thread(target=lambda: publication.consolidate(Backend(url), ["s"]), name="C")
    c.start()
    assert read.wait(60)
    monkeypatch.setattr(publication, "_copy", copy)
    b = threading.Thread(target=forced_write, name="B")
    b.start()
    try:
        while b.is_alive() and not waiting.wait(0.05):
            pass
        assert waiting.is_set() and not copies     # B waits, before it touched r's groups
    finally:
        go.set()
    c.join(60)
    b.join(60)
    monkeypatch.undo()
    assert not c.is_alive() and not b.is_alive() and forced == ["Died"]
    assert list(open_store(url).runs().run_id) == ["s"]
    assert "r" not in _root_runs(url)
