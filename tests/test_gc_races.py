"""``store gc`` and ``store migrate`` racing a writer that completes (or force-replaces) the same run id during
their pass over it: neither may remove what a complete run document names, nor publish another attempt's data
under it (``store.gc.collect_run``, ``store.migration._publish_run``; both work under the run's ``publish``
lease, the run document read again there).

The races are planted in process: the completion runs inside a step of the pass (gc's removal of a dead
writer's attempt, the step that takes longest on a big attempt or a remote store; migrate's reading of a run).
"""
from __future__ import annotations

import xarray as xr

from reward_lens_spec.store import open_store, write_run
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store import writer as store_writer
from reward_lens_spec.store.attempts import Attempt
from reward_lens_spec.store.gc import collect_run
from test_store import assert_same, make_attrs, make_results


def test_gc_never_removes_a_run_completed_during_its_pass(tmp_path, monkeypatch):
    url = str(tmp_path / "s.zarr")
    b = Backend(url)
    Attempt.create(b, "r", {"kind": "write"}).close()   # a dead writer's attempt: no lease, any age is old
    real, done = Attempt.remove, []

    def remove_while_another_completes(att):
        if not done:
            done.append(write_run(url, "r", make_results(4), make_attrs(4)))   # completes meanwhile
        return real(att)

    monkeypatch.setattr(Attempt, "remove", remove_while_another_completes)
    collect_run(b, "r", older_than_s=0)
    monkeypatch.undo()
    assert done == [True]
    store = open_store(url)
    assert list(store.runs().run_id) == ["r"]
    for obs, want in make_results(4).items():
        assert_same(store.load("r", obs), want)
        assert_same(xr.open_datatree(url, engine="zarr")[f"runs/r/{obs}"].to_dataset(), want)


def test_gc_never_removes_the_attempt_a_run_completed_during_its_pass_names(tmp_path, monkeypatch):
    """gc lists a live writer's attempt, that writer completes (and releases its role) while gc removes a dead
    attempt listed before it, then gc reaches it: released, and with ``older_than=0`` old; the run document
    names it now, so it stays."""
    import threading

    url = str(tmp_path / "s.zarr")
    b = Backend(url)
    Attempt.create(b, "r", {"kind": "write"}, aid="attempt-0").close()     # dead, listed first
    real_complete, real_remove = store_writer.complete, Attempt.remove
    in_complete, go = threading.Event(), threading.Event()

    def held_complete(att, *a, **k):
        in_complete.set()
        assert go.wait(60)
        return real_complete(att, *a, **k)

    def remove_while_it_completes(att):
        go.set()
        writer.join(60)
        return real_remove(att)

    monkeypatch.setattr(store_writer, "complete", held_complete)
    won = []
    writer = threading.Thread(target=lambda: won.append(write_run(url, "r", make_results(5), make_attrs(5))))
    writer.start()
    assert in_complete.wait(60)                      # its attempt exists, its role held: gc lists it
    monkeypatch.setattr(Attempt, "remove", remove_while_it_completes)
    collect_run(b, "r", older_than_s=0)
    monkeypatch.undo()
    assert won == [True]
    named = b.read_json("runs/r/zarr.json")["attributes"]["attempt"]
    assert Attempt.open(b, "r", named) is not None   # the attempt the complete document names is kept
    store = open_store(url)
    assert list(store.runs().run_id) == ["r"]
    for obs, want in make_results(5).items():
        assert_same(store.load("r", obs), want)


def test_gc_removing_a_run_the_root_still_lists_drops_it_from_the_root(tmp_path, monkeypatch):
    """A forced writer died after emptying the run document, before the root's metadata dropped the run; gc
    then removes the run's published groups: plain readers' metadata must not list it over nothing."""
    from reward_lens_spec.store import publish as publication
    from test_forced_replacement import Died, _root_runs

    url = str(tmp_path / "s.zarr")
    assert write_run(url, "r", make_results(0), make_attrs(0))

    def died(*a, **k):
        raise Died("consolidate")

    monkeypatch.setattr(publication, "consolidate", died)
    try:
        write_run(url, "r", make_results(1), make_attrs(1), force=True)
    except Died:
        pass
    monkeypatch.undo()
    assert collect_run(Backend(url), "r", older_than_s=0) == ["r"]
    assert "r" not in _root_runs(url)
    assert "r" not in xr.open_datatree(url, engine="zarr")["runs"].children


def test_store_migrate_racing_a_forced_rewrite_never_publishes_the_replaced_attempt(tmp_path, monkeypatch):
    """``store migrate`` on a layout-4 store reads a complete run, then a forced writer replaces the run whole,
    then migrate finds the published groups naming another attempt than the one it read: it must not publish
    the replaced attempt's data under the new run document."""
    from reward_lens_spec.store import migration

    url = str(tmp_path / "s.zarr")
    assert write_run(url, "r", make_results(0), make_attrs(0))
    real, done = migration.run_state, []

    def state_then_a_forced_rewrite(b, run_id):
        out = real(b, run_id)
        if not done:
            done.append(write_run(url, "r", make_results(1), make_attrs(1), force=True))
        return out

    monkeypatch.setattr(migration, "run_state", state_then_a_forced_rewrite)
    migration.migrate(url)
    monkeypatch.undo()
    assert done == [True]
    store = open_store(url)
    assert store.provenance("r")["seed"] == 1
    for obs, want in make_results(1).items():
        assert_same(store.load("r", obs), want)
        assert_same(xr.open_datatree(url, engine="zarr")[f"runs/r/{obs}"].to_dataset(), want)
