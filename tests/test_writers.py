"""One run id, one writer's data: real processes writing the same run id, displaced, slowed, killed.

Each writer writes seed-specific data *and* attrs, so a listed run mixing two writers shows up as
data of one seed under the attrs of another (or a missing variable / NaN chunk).
"""
from __future__ import annotations

import json
import os
import random
import signal
import time

import numpy as np
import pytest

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store import open_store, write_run
from reward_lens_spec.store.attempts import Attempt
from reward_lens_spec.store.completion import complete
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.log import read_log
from test_store import assert_same, make_attrs, make_results, spawn_writer


def assert_one_writer(url, run_id="r"):
    """The listed run is complete and its data and attrs come from one writer (one seed)."""
    store = open_store(url)
    assert list(store.runs().run_id) == [run_id]
    seed = store.provenance(run_id)["seed"]
    for obs, want in make_results(seed).items():
        assert_same(store.load(run_id, obs), want)
    return seed


def _wait(path, proc, timeout=120):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1].decode()[-2000:]
        time.sleep(0.01)


@pytest.mark.parametrize("force_a", [False, True])
def test_displaced_writer_resumes_and_cannot_change_the_listed_run(tmp_path, force_a):
    """A is slowed after its first observable, B (force) completes, then A resumes and finishes."""
    url = str(tmp_path / "s.zarr")
    marker = tmp_path / "a_sleeping"
    go = tmp_path / "a_go"
    a = spawn_writer(url=url, run_id="r", seed=1, slow_marker=str(marker), resume_on=str(go), force=force_a)
    _wait(marker, a)
    b = spawn_writer(url=url, run_id="r", seed=2, force=True)
    out_b, err_b = b.communicate(timeout=120)
    assert b.returncode == 0 and b"WON" in out_b, err_b.decode()[-2000:]
    assert assert_one_writer(url) == 2 and a.poll() is None     # while A still sleeps mid-write
    go.touch()
    out_a, err_a = a.communicate(timeout=120)
    assert a.returncode == 0, err_a.decode()[-2000:]
    # A forced: its own whole run replaces B's at once; not forced: B's stays listed, A's attempt goes
    assert assert_one_writer(url) == (1 if force_a else 2)
    assert (b"WON" in out_a) == force_a


def test_two_writers_of_one_run_id_killed_at_random_points(tmp_path):
    """Repeated: A and B (both force) race on one run id; either is SIGKILLed at a random moment.

    Whatever the timing, the listed run is either absent or one writer's, whole. Absent although the survivor
    completed: the victim (forced) had unlisted the survivor's run to replace it and was killed before listing its
    own (``store.completion``; ``test_forced_replacement.py`` plants that death at each step).
    """
    rng = random.Random(17)
    for rnd in range(6):
        url = str(tmp_path / f"s{rnd}.zarr")
        if rnd % 2:                                       # half the rounds start with a complete run
            write_run(url, "r", make_results(0), make_attrs(0))
        procs = [spawn_writer(url=url, run_id="r", seed=s, force=True) for s in (1, 2)]
        victim = rng.randrange(2)
        time.sleep(rng.uniform(0.5, 3.0))                 # imports take ~1 s: kill before, during or after
        procs[victim].send_signal(signal.SIGKILL)
        victim_out, _ = procs[victim].communicate(timeout=30)
        out, err = procs[1 - victim].communicate(timeout=180)
        assert procs[1 - victim].returncode == 0, err.decode()[-2000:]
        if open_store(url).runs().empty:                  # unlisted by the victim's replacement, never completed
            assert any(e["id"] == "r" for e in read_log(Backend(url)).entries)   # (the survivor had completed it)
            continue
        seed = assert_one_writer(url)
        assert seed in (0, 1, 2) and (seed != 0 or rnd % 2)
        # the survivor forced its run: readers list it, unless the victim published (both forced) after it. The
        # evidence log orders publications (entry, then document, under the run's publish lease), so the
        # victim's listed document must be the run's last log entry; its "WON" need not have reached its
        # stdout (killed after publishing, before its output was flushed)
        last = max(e["seq"] for e in read_log(Backend(url)).entries if e["id"] == "r")
        assert seed == (1 - victim) + 1 or open_store(url).provenance("r")["seq"] == last, (seed, victim_out)


def test_killed_writer_leaves_its_attempt_unlisted_and_its_lease_dead(tmp_path):
    url = str(tmp_path / "s.zarr")
    marker = tmp_path / "sleeping"
    a = spawn_writer(url=url, run_id="r", seed=1, slow_marker=str(marker))
    _wait(marker, a)
    b = Backend(url)
    (aid,) = [n for n in os.listdir(os.path.join(url, "_internal", "attempts", "r")) if n.startswith("attempt-")]
    att = Attempt.open(b, "r", aid)
    assert att.live_roles() == ["write"]                 # alive: its lease is held
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=30)
    assert att.live_roles() == []                        # same host, process gone: dead at once
    assert open_store(url).runs().empty
    assert write_run(url, "r", make_results(2), make_attrs(2))
    assert assert_one_writer(url) == 2 and os.path.isdir(att.b.path(att.prefix))   # not deleted by the writer


def test_fence_stops_a_displaced_or_stalled_holder(tmp_path):
    url = str(tmp_path / "s.zarr")
    write_run(url, "seed", make_results(0), make_attrs(0))     # creates the store
    b = Backend(url)
    att = Attempt.create(b, "r", {"kind": "test"}, role="write")
    att.fence("write")
    other = Attempt.open(b, "r", att.aid)
    assert not other.claim("write")                      # live: cannot be taken
    doc = json.loads(b.read(f"{att.prefix}/_ctl/lease.write.0.json"))
    doc.update(host="elsewhere", beat=time.time() - 3600)  # as if its heartbeat stopped long ago
    b.write_atomic(f"{att.prefix}/_ctl/lease.write.0.json", json.dumps(doc).encode())
    assert other.claim("write")                          # dead: generation 1 takes over
    with pytest.raises(StoreError, match="taken over"):
        att.fence("write")
    with pytest.raises(StoreError, match="taken over"):
        complete(att, {"x": 1}, "write")
    att._last_ok -= att.lease_s                          # a holder whose own renewals stalled
    with pytest.raises(StoreError, match="not renewed"):
        att.fence("write")
    other.close()
    att.close()
    assert np.all(open_store(url).incomplete() == ["r"])


def test_one_heartbeat_thread_renews_every_open_attempt(tmp_path):
    """The leases of every open attempt of this process are renewed by one thread (before: one thread per
    attempt), each every ``lease_s / 6`` seconds; a closed attempt's leases are no longer renewed."""
    import threading

    b = Backend(str(tmp_path / "s"))
    atts = [Attempt.create(b, f"run{i}", {"k": i}, role="shard-0", lease_s=0.6) for i in range(3)]
    try:
        assert len([t for t in threading.enumerate() if t.name.startswith("lease-") and t.is_alive()]) == 1
        beats = [a.leases()["shard-0"][1]["beat"] for a in atts]
        time.sleep(0.5)
        assert all(a.leases()["shard-0"][1]["beat"] > t for a, t in zip(atts, beats))
        atts[0].close()
        closed = atts[0].leases()["shard-0"][1]["beat"]
        time.sleep(0.3)
        assert atts[0].leases()["shard-0"][1]["beat"] == closed
        atts[1].fence("shard-0")
    finally:
        for a in atts:
            a.close()


def test_completion_checks_read_the_run_document_alone(tmp_path, monkeypatch):
    """Whether an attempt is named (``Attempt.named``, asked on every claim) and whether a run is complete
    (``state.complete_attrs``) are read from the run document alone — nothing listed (before: two listings per
    question on an incomplete run) — and agree with ``run_state`` for an incomplete, a complete, a corrupt and
    an absent run."""
    from reward_lens_spec.store.state import complete_attrs, run_state

    b = Backend(str(tmp_path / "s"))
    att = Attempt.create(b, "r", {"k": 1}, role="shard-0")
    try:
        listed = []
        real = Backend.list_dirs
        monkeypatch.setattr(Backend, "list_dirs", lambda self, key: (listed.append(key), real(self, key))[1])
        assert not att.named() and complete_attrs(b, "r") is None and listed == []
        assert run_state(b, "r") == ("incomplete", {}) and listed
        b.write_atomic("runs/r/zarr.json", json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {
            "complete": True, "attempt": att.aid}}).encode())
        assert att.named() and complete_attrs(b, "r") == run_state(b, "r")[1] == {"complete": True, "attempt": att.aid}
        b.write_atomic("runs/r/zarr.json", b"{garbage")
        assert not att.named() and complete_attrs(b, "r") is None and run_state(b, "r") == ("corrupt", None)
        assert complete_attrs(b, "nothing") is None and run_state(b, "nothing") == ("absent", None)
    finally:
        att.close()
