"""launch/slurm.sbatch on a real one-node SLURM cluster: munged, slurmctld and slurmd started
here with all their state in a temporary folder (Debian's slurm-wlm and munge; .ci/run
installs them where it runs as root). A job of two CPU processes trains, is requeued
mid-run, and resumes from the checkpoint its SIGTERM wrote. Skipped, with the reason,
where SLURM is not installed or the tests do not run as root."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from helpers import QUIET, REPO, TINY, free_port, read_metrics, write_random_shards

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
MISSING = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"SLURM is not installed here ({', '.join(MISSING)} "
                       f"missing): apt-get install slurm-wlm munge (.ci/run does, as root)"),
    pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() != 0,
                       reason="the test cluster's daemons run as root (SlurmUser=root): run as root"),
]


def which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
    """A one-node cluster on this machine; its commands get SLURM_CONF through env."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        r, node = self.root, socket.gethostname().split(".")[0]
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir()
        (r / "munge").chmod(0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = r / "munge" / "munge.sock"
        (r / "slurm.conf").write_text("\n".join([
            "ClusterName=test", f"SlurmctldHost={node}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SwitchType=switch/none",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2", "JobRequeue=1", "KillWait=60", "MinJobAge=600", "GresTypes=gpu",
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
        self._daemon([which("munged"), "-F", "-f", f"--socket={sock}", f"--key-file={key}",
                      f"--log-file={r / 'munge' / 'munged.log'}", f"--pid-file={r / 'munge' / 'pid'}",
                      f"--seed-file={r / 'munge' / 'seed'}"])
        self._wait(sock.exists, 30, "munged to create its socket")
        self._daemon([which("slurmctld"), "-D", "-i"])
        self._daemon([which("slurmd"), "-D", "-N", node])
        self._wait(lambda: "idle" in self.run("sinfo", "-h", "-o", "%T").stdout, 60,
                   "the node to come up idle")

    def _daemon(self, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{Path(cmd[0]).name}.out", "w")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log,
                                           start_new_session=True))

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.5)

    def run(self, *cmd: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), env={**self.env, **(env or {})}, cwd=cwd, capture_output=True,
                              text=True, timeout=60)

    def state(self, job: str) -> str:
        out = self.run("scontrol", "show", "job", job).stdout
        return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "?")

    def logs(self) -> str:
        parts = []
        for f in sorted((self.root / "log").glob("*")) + sorted(self.root.glob("job-*.out")):
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for p in reversed(self.procs):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                    p.wait(timeout=20)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def submit(cluster: Cluster, out: Path, data: Path, *flags: str) -> str:
    """sbatch launch/slurm.sbatch from the repository's root, two CPU processes, no GPU."""
    env = {"NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1", "PYTHON": sys.executable,
           "MASTER_PORT": str(free_port())}
    proc = cluster.run("sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=2",
                       f"--output={cluster.root}/job-%j.out", str(REPO / "launch" / "slurm.sbatch"),
                       *TINY, *QUIET, "--total-batch-tokens", "256", "--data-dir", str(data),
                       "--out-dir", str(out), *flags, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def test_a_job_trains_and_a_requeued_job_resumes_from_its_checkpoint(cluster: Cluster,
                                                                      tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=7, train=(30_000,))
    out = tmp_path / "run"
    job = submit(cluster, out, data, "--max-steps", "16", "--checkpoint-every", "1000")
    cluster._wait(lambda: (out / "metrics.jsonl").exists() and len(read_metrics(out, "train")) >= 3,
                  240, f"job {job} to train a few steps")
    assert cluster.run("scontrol", "requeue", job).returncode == 0
    # SLURM sends SIGTERM; the trainer finishes its step and saves before it exits.
    cluster._wait(lambda: any(out.glob("ckpt_*.pt")), 120, "the checkpoint SIGTERM writes")
    # Back in the queue, a requeued job waits two minutes before it may start: start it now.
    cluster._wait(lambda: cluster.state(job) == "PENDING", 120, f"job {job} to be requeued")
    assert cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now").returncode == 0
    cluster._wait(lambda: cluster.state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 300,
                  f"the requeued job {job} to finish")
    assert cluster.state(job) == "COMPLETED", cluster.logs()
    runs = read_metrics(out, "run")
    assert len(runs) == 2 and runs[1]["start_step"] > 0 and runs[1]["resumed_from"]
    assert all(r["world_size"] == 2 for r in runs)  # two processes, as NPROC_PER_NODE asked
    steps = {r["step"] for r in read_metrics(out, "train")}
    assert steps == set(range(16))  # nothing lost, nothing skipped
