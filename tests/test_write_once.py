"""Completed runs are write-once (issue 26): a writer stopped (SIGSTOP) while it creates the array skeleton,
whose lease lapses while another writer adopts the attempt and completes the run, can neither delete nor
overwrite that run when it resumes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

from reward_lens_spec import open_store
from reward_lens_spec.store import catalog_cli

ARGS = ["observable=dla", "dataset.limit=8", "store.chunk_pairs=2", "model.batch_size=2"]
LEASE_S = "3"
# the run command, stopping itself (SIGSTOP) on its one-pass skeleton write (pair labels and arrays): after it
# passed its fence, before any array is created (the worst moment)
STOPPING = """
import os, signal, sys
import reward_lens_spec.run.stream_arrays as s
orig = s.write_new_groups
def stopping(*a, **k):
    if not os.environ.get("STOPPED"):
        os.environ["STOPPED"] = "1"
        os.kill(os.getpid(), signal.SIGSTOP)
    return orig(*a, **k)
s.write_new_groups = stopping
from reward_lens_spec.cli import main
main(sys.argv[1:])
"""


def _env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "REWARD_LENS_SPEC_LEASE_S": LEASE_S}


def _stopped(pid) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_stalled_skeleton_writer_cannot_wipe_a_completed_run(tmp_path):
    # one round: A stops itself at a fixed point (its first write_new_groups), so more rounds repeat one interleaving
    url = str(tmp_path / "s.zarr")
    a = subprocess.Popen([sys.executable, "-c", STOPPING, *ARGS, f"store.url={url}"], cwd=tmp_path,
                         env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while not _stopped(a.pid):
            assert a.poll() is None, a.communicate()[1].decode()[-3000:]      # A exited: its stderr
            assert time.time() < deadline, "A never reached its skeleton write"  # communicate() would wait on A
            time.sleep(0.05)
        time.sleep(float(LEASE_S) + 1)                      # A's leases lapse
        b = subprocess.run([sys.executable, "-m", "reward_lens_spec", *ARGS, f"store.url={url}"], cwd=tmp_path,
                           env=_env(), capture_output=True, text=True, timeout=600)
        assert b.returncode == 0, b.stderr[-3000:]
        st = open_store(url)
        (rid,) = list(st.runs().run_id)
        want = st.load(rid, lazy=False)
        a.send_signal(signal.SIGCONT)                       # A resumes inside its skeleton write
        _, err = a.communicate(timeout=300)
        assert a.returncode != 0, "the stalled writer should have been fenced out"
        st = open_store(url)
        assert list(st.runs().run_id) == [rid]
        got = st.load(rid, lazy=False)
        for obs in want:
            assert set(got[obs]) == set(want[obs]) and got[obs]
            for v in want[obs]:
                np.testing.assert_array_equal(got[obs][v].values, want[obs][v].values, err_msg=v)
        assert catalog_cli.main(["verify", f"url={url}"]) == 0
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
            a.kill()
            a.wait()
