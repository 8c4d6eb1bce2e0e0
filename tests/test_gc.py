"""store gc collects only garbage: never a live writer's attempt, never through a symlink."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store import open_store, write_run
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.attempts import Attempt
from reward_lens_spec.store.catalog_cli import main as store_cli
from test_store import assert_same, make_attrs, make_results, spawn_writer
from test_writers import _wait


def test_gc_during_a_live_write_removes_nothing_of_it(tmp_path):
    url = str(tmp_path / "s.zarr")
    write_run(url, "done", make_results(0), make_attrs(0))
    marker = tmp_path / "sleeping"
    go = tmp_path / "go"
    w = spawn_writer(url=url, run_id="live", seed=3, slow_marker=str(marker), resume_on=str(go))
    _wait(marker, w)                                       # first observable on disk, writer alive
    store = open_store(url)
    assert store.incomplete() == ["live"]
    for _ in range(3):                                     # any age, repeatedly, from the CLI too
        assert store.remove_incomplete(older_than_s=0) == []
    assert store_cli(["gc", f"url={url}", "older_than=0"]) == 0
    assert w.poll() is None                                # still alive and mid-write throughout
    go.touch()
    out, err = w.communicate(timeout=120)
    assert w.returncode == 0 and b"WON" in out, err.decode()[-2000:]
    assert sorted(store.runs().run_id) == ["done", "live"]
    assert_same(store.load("live", "lens"), make_results(3)["lens"])


def test_gc_removes_a_dead_writers_attempt_only_past_the_age(tmp_path):
    url = str(tmp_path / "s.zarr")
    marker = tmp_path / "sleeping"
    w = spawn_writer(url=url, run_id="r", seed=1, slow_marker=str(marker))
    _wait(marker, w)
    w.send_signal(signal.SIGKILL)
    w.wait(timeout=30)
    store = open_store(url)
    assert store.remove_incomplete() == [] and store.incomplete() == ["r"]   # default age: kept
    b = Backend(url)
    (aid,) = [n for n in os.listdir(b.path("_internal/attempts/r")) if n.startswith("attempt-")]
    # another host's writer, heartbeat fresh: kept at any age (its process cannot be checked from here)
    remote = Attempt.create(b, "r", {"kind": "write"})
    key = f"{remote.prefix}/_ctl/lease.write.0.json"
    b.create_exclusive(key, json.dumps({"host": "node17", "pid": 1, "beat": time.time(), "released": False}).encode())
    assert store.remove_incomplete(older_than_s=0) == [f"r/{aid}"]
    assert store.incomplete() == ["r"]
    b.write_atomic(key, json.dumps({"host": "node17", "pid": 1, "beat": time.time() - 7200,
                                    "released": False}).encode())   # its heartbeat stopped 2 h ago
    assert store.remove_incomplete() == ["r"] and not os.path.exists(b.path("runs/r"))


def test_gc_and_force_never_follow_a_symlink_out_of_the_store(tmp_path):
    other = str(tmp_path / "other.zarr")
    write_run(other, "theirs", make_results(5), make_attrs(5))
    url = str(tmp_path / "s.zarr")
    write_run(url, "mine", make_results(0), make_attrs(0))
    os.symlink(os.path.join(other, "runs", "theirs"), os.path.join(url, "runs", "planted"))
    outside = tmp_path / "thesis.tex"
    outside.write_text("keep me")
    b = Backend(url)
    dead = Attempt.create(b, "crashed", {"kind": "write"})   # a garbage attempt with a link inside it
    os.symlink(str(outside), os.path.join(b.path(dead.prefix), "link.tex"))
    os.symlink(str(tmp_path), os.path.join(b.path(dead.prefix), "linkdir"))
    before = {p: open(p, "rb").read() for p in _files(other)}
    store = open_store(url)
    assert "planted" not in list(store.runs().run_id) + store.incomplete()
    assert store.remove_incomplete(older_than_s=0) == ["crashed"]
    assert store_cli(["gc", f"url={url}", "older_than=0"]) == 0
    with pytest.raises(StoreError, match="symbolic link"):
        write_run(url, "planted", make_results(1), make_attrs(1), force=True)
    assert {p: open(p, "rb").read() for p in _files(other)} == before
    assert outside.read_text() == "keep me" and os.path.islink(os.path.join(url, "runs", "planted"))
    assert_same(open_store(other).load("theirs", "lens"), make_results(5)["lens"])
    assert list(store.runs().run_id) == ["mine"]


def _files(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def test_lock_leases_keep_one_generation_and_gc_leaves_the_root_lease(tmp_path):
    """Every completion claims the store-wide ``root`` lease and the run's ``publish`` lease anew: each claim
    removes the generation before, so their folders stay one file however many completions (here 5 root
    updates: 1, then 2 per forced rewrite); ``store gc`` (runs listed from ``runs/``) never sees ``_root``."""
    url = str(tmp_path / "s.zarr")
    for seed in range(3):
        assert write_run(url, "r", make_results(seed), make_attrs(seed), force=True)
    ctl = tmp_path / "s.zarr" / "_internal" / "attempts"
    assert sorted(os.listdir(ctl / "_root" / "_publish" / "_ctl")) == ["lease.root.4.json"]
    assert sorted(os.listdir(ctl / "r" / "_publish" / "_ctl")) == ["lease.publish.2.json"]
    assert json.loads((ctl / "_root" / "_publish" / "_ctl" / "lease.root.4.json").read_text())["released"]
    assert len(open_store(url).remove_incomplete(older_than_s=0)) == 2      # the two replaced attempts of r
    assert store_cli(["gc", f"url={url}", "older_than=0"]) == 0
    assert sorted(os.listdir(ctl)) == ["_root", "r"] and list(open_store(url).runs().run_id) == ["r"]


def test_a_lock_lease_is_decided_by_its_highest_generation_after_lower_ones_are_removed(tmp_path):
    """A claimer that listed before two later claims re-creates a removed generation: it sees the higher one,
    removes its file and does not hold the lease; a displaced holder whose next generation was removed still
    finds itself superseded (its fence looks for any higher generation)."""
    from reward_lens_spec.store.attempts import PUBLISH

    b = Backend(str(tmp_path / "s.zarr"))
    ctl = tmp_path / "s.zarr" / "_internal" / "attempts" / "_root" / "_publish" / "_ctl"
    held = Attempt(b, "_root", PUBLISH, {})
    assert held.claim("root")                              # gen 0, left unreleased: its holder stalls
    held.close()                                           # its heartbeat stops
    time.sleep(0.6)                                        # dead to claimers whose lease time is 0.5 s
    stale, *later = [Attempt(b, "_root", PUBLISH, {}, lease_s=0.5) for _ in range(3)]
    seen = stale.leases()                                  # listed now: gen 0, dead
    assert later[0].claim("root")                          # gen 1, removes gen 0
    later[0].release("root")
    assert later[1].claim("root")                          # gen 2, removes gen 1
    stale.leases = lambda: seen
    assert not stale.claim("root")                         # re-creates gen 1: superseded, removed again
    assert sorted(os.listdir(ctl)) == ["lease.root.2.json"]
    held._held["root"], held._last_ok = 0, time.monotonic()    # as if its heartbeat had just renewed it
    with pytest.raises(StoreError, match="taken over"):
        held.fence("root")
    for att in later + [stale]:
        att.close()
