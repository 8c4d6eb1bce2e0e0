"""A sweep submitted to a real Slurm cluster (single node on loopback) through ``hydra/launcher=slurm``.

The fixture starts munged, slurmctld and slurmd (``tests/slurm_cluster.py``) and stops them, and every
process of their jobs, when the test ends, passed or failed. The test submits a two-model ×
two-observable sweep as one job array into one store, SIGKILLs the Python process of one array task while
its run is half written, requeues that task with ``scontrol requeue``, and checks that the store then
equals the one the basic launcher writes in this process's machine: the same run ids, every array the same
bytes, and the requeued run computed only the chunks its killed job had not written.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reward_lens_spec import open_store
from tests.conftest import SUBMITIT
from tests.slurm_cluster import MISSING, single_node_slurm
from tests.test_streaming import assert_bit_identical

pytestmark = [pytest.mark.slow, SUBMITIT,
              pytest.mark.skipif(bool(MISSING), reason=f"needs Slurm: {', '.join(MISSING)} not found "
                                                       "(apt-get install slurm-wlm munge)")]

N_PAIRS = 24
SWEEP = ["model=tiny,tiny_gpt2", "observable=score,lens", f"dataset.limit={N_PAIRS}", "store.chunk_pairs=1",
         "model.batch_size=1", "model.threads=1"]
# what a lab types (docs/sweeps.md), sized to this one 4-CPU node
LAB = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=30",
       "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1", "hydra.launcher.array_parallelism=4"]


@pytest.fixture
def slurm(tmp_path):
    with single_node_slurm(tmp_path / "slurm") as cluster:
        yield cluster


def _cli(cwd, env, *args):
    return [sys.executable, "-m", "reward_lens_spec", *args], dict(cwd=cwd, env={**env, "HF_HUB_OFFLINE": "1"})


def _markers(attempt: str) -> int:
    return len(glob.glob(os.path.join(attempt, "_ctl", "chunk.*.json")))


def _job_env(pid: int) -> dict:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def _writer_mid_run(url: str, conf: str):
    """(pid, Slurm job id, attempt folder) of an array task whose run has written 2 to N-3 of its chunks."""
    for attempt in glob.glob(os.path.join(url, "_internal", "attempts", "*", "attempt-*")):
        if not 2 <= _markers(attempt) <= N_PAIRS - 3:
            continue
        for lease in glob.glob(os.path.join(attempt, "_ctl", "lease.*.json")):
            try:
                pid = json.loads(Path(lease).read_text())["pid"]
            except (OSError, ValueError, KeyError):
                continue
            env = _job_env(pid)
            if env.get("SLURM_CONF") == conf and "SLURM_ARRAY_TASK_ID" in env:
                return pid, f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}", attempt
    return None


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def _wait(what: str, cond, proc, log: Path, timeout: float = 600, every: float = 0.01):
    deadline = time.time() + timeout
    while True:
        got = cond()
        if got:
            return got
        if proc.poll() is not None or time.time() > deadline:
            raise AssertionError(f"{what}: not seen (sweep rc {proc.returncode})\n{_tail(log)}")
        time.sleep(every)


def test_slurm_job_array_killed_and_requeued_equals_the_basic_launcher(tmp_path, slurm):
    conf = slurm.env["SLURM_CONF"]
    url = str(tmp_path / "lab.zarr")
    cmd, kw = _cli(tmp_path, slurm.env, "--multirun", *LAB, *SWEEP, "hydra.sweep.dir=sw", f"store.url={url}")
    with open(tmp_path / "sweep.out", "w") as out, open(tmp_path / "sweep.err", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, **kw)
    try:
        pid, job, attempt = _wait("an array task half way through its run", lambda: _writer_mid_run(url, conf), proc,
                                  tmp_path / "sweep.err")
        os.kill(pid, signal.SIGKILL)                                   # the job dies mid-run
        state = _wait(f"job {job} ending", lambda: (slurm.job(job).get("JobState") not in
                                                    (None, "RUNNING", "COMPLETING")) and slurm.job(job)["JobState"],
                      proc, tmp_path / "sweep.err", every=0.2)
        assert state == "FAILED", slurm.job(job)
        n_before = _markers(attempt)
        assert 2 <= n_before < N_PAIRS
        assert os.path.basename(os.path.dirname(attempt)) in open_store(url).incomplete()
        slurm.run("scontrol", "requeue", job)                          # Slurm runs the same task again
        assert slurm.job(job)["Restarts"] == "1"                       # (after CRED_EXPIRE_S)
        deadline = time.time() + 900
        while proc.poll() is None:
            again = slurm.job(job)
            assert again.get("JobState") in ("PENDING", "RUNNING", "COMPLETING", "COMPLETED"), \
                f"{job} after its requeue: {again}\n{slurm.logs()}"
            assert time.time() < deadline, f"the sweep did not finish\n{_tail(tmp_path / 'sweep.err')}"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, _tail(tmp_path / "sweep.err")
    assert "Submitit 'slurm'" in (tmp_path / "sweep.err").read_text() + (tmp_path / "sweep.out").read_text()
    deadline = time.time() + 120                                     # the tasks' own ends follow their results
    while slurm.queue() and time.time() < deadline:
        time.sleep(0.2)
    tasks = {j: slurm.job(j) for j in (f"{job.split('_')[0]}_{i}" for i in range(4))}
    assert {j: t["JobState"] for j, t in tasks.items()} == {j: "COMPLETED" for j in tasks}
    assert {j: t["Restarts"] for j, t in tasks.items()} == {j: "1" if j == job else "0" for j in tasks}

    cmd, kw = _cli(tmp_path, os.environ, "--multirun", *SWEEP, "hydra.sweep.dir=basic", "store.url=basic.zarr")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert res.returncode == 0, res.stderr[-4000:]

    lab, basic = open_store(url), open_store(str(tmp_path / "basic.zarr"))
    assert lab.incomplete() == []
    ids = sorted(lab.runs()["run_id"])
    assert len(ids) == 4 and ids == sorted(basic.runs()["run_id"])
    for rid in ids:
        assert_bit_identical(lab.load(rid, lazy=False), basic.load(rid, lazy=False))
        by_writer = lab.provenance(rid)["chunks"]["by_writer"]
        if rid == os.path.basename(os.path.dirname(attempt)):           # resumed: only the missing chunks ran
            assert sorted(by_writer.values()) == sorted([n_before, N_PAIRS - n_before])
        else:
            assert list(by_writer.values()) == [N_PAIRS]
