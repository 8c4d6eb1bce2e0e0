"""A real single-node Slurm cluster on loopback for the launcher tests (Debian's ``slurm-wlm`` and ``munge``).

``single_node_slurm(folder)`` writes a private munge key, a ``slurm.conf`` and state/spool folders under
``folder``, starts ``munged`` (its own socket), ``slurmctld`` and ``slurmd`` (controller and node on
127.0.0.1, ports picked free) in the foreground as child processes, waits until the node is idle, and
yields a ``Cluster``: ``env`` (this process's environment plus ``SLURM_CONF``, which every Slurm client —
``sbatch``, ``squeue``, ``scontrol`` and submitit's calls to them — reads to find this cluster) and
helpers to drive it. On exit, normal or not, it cancels every job of this cluster, stops the daemons it
started (SIGTERM, then SIGKILL), and kills by pid any process still holding this cluster's ``SLURM_CONF``
in its environment (job steps and their Python processes, which ``slurmstepd`` detaches from ``slurmd``).
Nothing is left running and the system's own munge/Slurm (if any) is not touched.

The daemons run as the current user (root on the CI machine); ``MISSING`` names the binaries a test needs,
so it can skip with that reason where Slurm is not installed (``apt-get install slurm-wlm munge``).
"""
from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
MISSING = [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
NODE = "rlsnode"
# a job credential's lifetime; Slurm also holds a requeued job this long before it may start again, since
# slurmd refuses to launch a job whose previous run's credential it revoked (default 120 s)
CRED_EXPIRE_S = 30
PARTITION = "debug"


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _conf(d: Path, ctl_port: int, node_port: int, cpus: int) -> str:
    user = getpass.getuser()
    return f"""\
ClusterName=rlstest
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmdPort={node_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d / 'munge.socket'},cred_expire={CRED_EXPIRE_S}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={d / 'plugstack.conf'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
MinJobAge=3600
NodeName={NODE} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4096 State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Cluster:
    folder: Path
    env: dict

    def run(self, *cmd: str, check: bool = True) -> str:
        """Run a Slurm client command against this cluster; its stdout."""
        res = subprocess.run([_which(cmd[0]), *cmd[1:]], env=self.env, capture_output=True, text=True, timeout=60)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}\n{self.logs()}")
        return res.stdout

    def job(self, job_id: str) -> dict:
        """``scontrol show job`` as a dict of its ``Key=Value`` fields (empty when Slurm forgot the job)."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def queue(self) -> list[str]:
        """Ids (``%i``: ``<array>_<task>``) of this cluster's jobs that are pending or running."""
        return self.run("squeue", "-h", "-o", "%i %T").split("\n")[:-1]

    def logs(self) -> str:
        tail = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            p = self.folder / name
            if p.exists():
                tail.append(f"--- {name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:]))
        return "\n".join(tail)


def _holders(conf: str) -> list[int]:
    """Pids of processes (other than this one) whose environment names this cluster's slurm.conf."""
    needle = f"SLURM_CONF={conf}".encode()
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if needle in (p / "environ").read_bytes().split(b"\0"):
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


@contextlib.contextmanager
def single_node_slurm(folder: Path, cpus: int = 4, start_timeout: float = 120.0):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)                          # munged refuses a key or socket in a folder others may write
    for sub in ("state", "spool"):
        (folder / sub).mkdir(exist_ok=True)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    (folder / "plugstack.conf").write_text("")      # no SPANK plugins (not the system's plugstack.conf.d)
    conf = folder / "slurm.conf"
    conf.write_text(_conf(folder, *_free_ports(2), cpus=cpus))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"]:
        del env[k]                                   # a test run inside a Slurm job must not leak its job's settings
    cluster = Cluster(folder, env)
    procs: list[subprocess.Popen] = []

    def start(*cmd: str, log: str) -> None:
        out = open(folder / log, "ab")
        procs.append(subprocess.Popen([_which(cmd[0]), *cmd[1:]], env=env, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
        out.close()

    try:
        start("munged", "--foreground", "--force", f"--socket={folder / 'munge.socket'}", f"--key-file={key}",
              f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
              f"--seed-file={folder / 'munged.seed'}", log="munged.out")
        deadline = time.time() + start_timeout
        while not (folder / "munge.socket").exists():
            if procs[0].poll() is not None or time.time() > deadline:
                raise RuntimeError("munged did not start:\n" + cluster.logs())
            time.sleep(0.1)
        start("slurmctld", "-D", "-c", "-f", str(conf), log="slurmctld.out")
        start("slurmd", "-D", "-f", str(conf), "-N", NODE, log="slurmd.out")
        while True:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a Slurm daemon exited at start:\n" + cluster.logs())
            state = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).strip()
            if state in ("idle", "mixed", "allocated"):
                break
            if time.time() > deadline:
                raise RuntimeError(f"node {NODE} is {state or 'unreachable'} after {start_timeout:.0f} s:\n"
                                   + cluster.logs())
            time.sleep(0.5)
        yield cluster
    finally:
        if len(procs) >= 2 and procs[1].poll() is None:  # cancel this cluster's jobs while the controller runs
            cluster.run("scancel", "--full", f"--partition={PARTITION}", check=False)
            deadline = time.time() + 30
            while time.time() < deadline and cluster.run("squeue", "-h", check=False).strip():
                time.sleep(0.5)
        for proc in reversed(procs):                 # slurmd, slurmctld, munged
            _stop(proc)
        for _ in range(3):                           # detached job steps and their processes, by pid
            pids = _holders(str(conf))
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not pids:
                break
            time.sleep(0.5)
