"""A one-node SLURM cluster on this machine, for the tests: munge, the controller (``slurmctld``) and the node daemon
(``slurmd``), started as root from Debian's packages (``slurm-wlm``, ``munge``; ``.ci/run`` installs them), with a
``slurm.conf`` written for this machine (its cores and memory as the node's resources, no GPU), and stopped at the end
with nothing left running.

Its ``slurm.conf`` is also put where SLURM's commands look by default (``SYSTEM_CONF``, /etc/slurm/slurm.conf), and
removed at the end: Snakemake's SLURM job step drops every ``SLURM_*`` variable but a few from a job's environment,
``SLURM_CONF`` included, so that the ``srun`` inside a job finds only the default; a machine with a configuration of
its own there is left alone (``missing`` says so).

Without accounting (no ``slurmdbd``), ``sacct`` has nothing to say: finished jobs stay visible to ``squeue`` for
``MIN_JOB_AGE`` seconds, which is what Snakemake's SLURM executor falls back on. ``missing()`` says in one line why a
cluster cannot start here (then the tests that need one are skipped)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "sinfo")
MIN_JOB_AGE = 3600
"""Seconds a finished job stays in the controller's memory (``squeue`` shows it): longer than any test."""
PARTITION = "tests"
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
MARK = "# written by diffeqformer's test cluster (tests/slurm_cluster.py), removed when it stops\n"


def missing() -> str | None:
    """Why no cluster can start here, in one line, or None."""
    absent = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()]
    if absent:
        return (f"SLURM is not installed here ({', '.join(absent)} missing): .ci/run installs Debian's slurm-wlm and "
                "munge")
    if os.geteuid() != 0:
        return "the test cluster's daemons run as root, and this is not root"
    if SYSTEM_CONF.exists() and not SYSTEM_CONF.read_text(errors="replace").startswith(MARK):
        return f"this machine has a SLURM configuration of its own ({SYSTEM_CONF}), which the test cluster leaves alone"
    if not Path("/etc/munge/munge.key").exists():
        return "munge has no key (/etc/munge/munge.key): reinstall Debian's munge package"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """A running test cluster: ``env`` is what its client commands need (``SLURM_CONF``)."""

    root: Path
    conf: Path
    node: str
    cpus: int
    memory_mb: int
    env: dict = field(default_factory=dict)
    daemons: list = field(default_factory=list)

    def run(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """A client command (``sinfo``, ``squeue``...) against this cluster."""
        out = subprocess.run(list(args), env={**os.environ, **self.env, **kw.pop("env", {})}, capture_output=True,
                             text=True, **kw)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()

    def jobs(self) -> list[dict]:
        """Every job the controller still knows, finished ones too (``squeue``): id, name, state, CPUs."""
        out = self.run("squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%C").stdout
        return [dict(zip(("id", "name", "state", "cpus"), line.split("|"))) for line in out.splitlines()
                if line.strip()]

    def log(self, daemon: str) -> str:
        path = self.root / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _write_conf(root: Path, node: str, cpus: int, memory_mb: int, munge_socket: Path) -> Path:
    ctl, slurmd = _free_port(), _free_port()
    (root / "state").mkdir()
    (root / "spool").mkdir()
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=diffeqformer-tests",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={ctl}", f"SlurmdPort={slurmd}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}", f"SlurmdLogFile={root / 'slurmd.log'}",
        # a container's processes: no cgroups to track or bind them by
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill", "ReturnToService=2",
        # a job that asks for more than a node of its partition has is refused when it is submitted, not left pending
        "EnforcePartLimits=ALL",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none", f"MinJobAge={MIN_JOB_AGE}",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5", "MessageTimeout=20",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n")
    return conf


def _stop_stale() -> None:
    """Stop the daemons of a test cluster whose process was killed before it could stop them (a SIGKILLed test run):
    those started with a configuration or socket below the temporary folder."""
    import psutil

    tmp = tempfile.gettempdir()
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["name"] in DAEMONS and (f"-f {tmp}/" in cmd or f"--socket={tmp}/" in cmd):
            p.kill()


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def cluster(root: Path, *, ready_s: float = 60.0):
    """Start munge, slurmctld and slurmd in ``root`` (their configuration, state, logs and sockets), wait until the
    node is idle, yield the ``Cluster``; stop the daemons at the end, whatever happened (SIGTERM included: it
    interrupts the tests as Ctrl-C does, so that this runs)."""
    why = missing()
    if why:
        raise RuntimeError(why)
    _stop_stale()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    root.mkdir(parents=True, exist_ok=True)
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.9)
    munge_socket = root / "munge.socket"
    conf = _write_conf(root, node, cpus, memory_mb, munge_socket)
    env = {"SLURM_CONF": str(conf)}
    daemons = []
    made = Cluster(root, conf, node, cpus, memory_mb, env, daemons)
    try:
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SYSTEM_CONF.write_text(MARK + conf.read_text())
        daemons.append(subprocess.Popen(
            [_exe("munged"), "--foreground", "--force", f"--socket={munge_socket}",
             f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
             f"--seed-file={root / 'munged.seed'}"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True))
        _wait(lambda: munge_socket.exists(), 10, "munged did not open its socket", made, "munged")
        for daemon in ("slurmctld", "slurmd"):
            daemons.append(subprocess.Popen([_exe(daemon), "-D", "-f", str(conf)], env={**os.environ, **env},
                                            stdout=open(root / f"{daemon}.out", "w"), stderr=subprocess.STDOUT,
                                            start_new_session=True))
        _wait(lambda: made.node_state() == "idle", ready_s, "the node did not become idle", made, "slurmd")
        yield made
    finally:
        if len(daemons) == len(DAEMONS):  # jobs a failed test left queued or running end with the cluster
            made.run("scancel", "--full", "--user", "root", check=False)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(
                    j["state"] in ("PENDING", "RUNNING", "COMPLETING") for j in made.jobs()):
                time.sleep(0.5)
        for p in reversed(daemons):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(daemons):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if SYSTEM_CONF.exists() and SYSTEM_CONF.read_text(errors="replace").startswith(MARK):
            SYSTEM_CONF.unlink()
        signal.signal(signal.SIGTERM, previous)


def _wait(ready, seconds: float, message: str, made: Cluster, daemon: str) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            printed = made.root / f"{daemon}.out"
            text = made.log(daemon) or (printed.read_text(errors="replace") if printed.exists() else "")
            tail = "\n".join(text.splitlines()[-15:])
            raise RuntimeError(f"{message} within {seconds:.0f} s; the end of its log:\n{tail}")
        time.sleep(0.5)
