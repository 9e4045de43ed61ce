"""A real one-node SLURM cluster on localhost for the launch tests (munge, slurmctld, slurmd).

`LocalSlurm.start(scratch)` writes a slurm.conf under `scratch`, installs Debian's slurm-wlm and
munge where they are missing (as root, through apt-get), starts munged unless one already
answers, then slurmctld and slurmd, and waits until `sinfo` shows the node idle. `stop()` stops
only the daemons it started. Every client command gets the conf through the SLURM_CONF in
`env`. Where any of that cannot be done (not root, no apt-get, a daemon that does not come up)
`start` raises `SlurmUnavailable` with the reason, and the tests skip with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "mungekey")


class SlurmUnavailable(RuntimeError):
    """SLURM cannot run here; the message says why."""


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None
    )


def install_if_missing() -> None:
    missing = [d for d in DAEMONS if _which(d) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SlurmUnavailable(
            f"{', '.join(missing)} not installed, and this is not root with apt-get to install "
            f"{' '.join(PACKAGES)}"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if p.returncode:
            raise SlurmUnavailable(f"{' '.join(argv)} failed: {p.stderr.strip()[-500:]}")


def _slurm_conf(scratch: str, node: str) -> str:
    mem_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return f"""\
ClusterName=tfmtest
SlurmctldHost={node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job may restart 6 s after it stops (the default 120 s makes it ~145 s; 10 made it
# 11 s; 5 is the least SLURM takes: below it logs "invalid" and keeps 120), and the main
# scheduler, which starts it, looks every second (by default the next look, of it or of the
# backfill scheduler, came 13 to 53 s later)
AuthInfo=cred_expire=5
SchedulerParameters=sched_interval=1
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
JobRequeue=1
MpiDefault=none
ReturnToService=2
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={scratch}/state
SlurmdSpoolDir={scratch}/spool
SlurmctldPidFile={scratch}/slurmctld.pid
SlurmdPidFile={scratch}/slurmd.pid
SlurmctldLogFile={scratch}/slurmctld.log
SlurmdLogFile={scratch}/slurmd.log
MinJobAge=600
KillWait=60
NodeName={node} CPUs={os.cpu_count()} RealMemory={int(mem_mib * 0.8)} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class LocalSlurm:
    def __init__(self, scratch: str):
        self.scratch = str(scratch)
        self.node = socket.gethostname().split(".")[0]
        self.conf = os.path.join(self.scratch, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self._started: list[tuple[str, str]] = []  # (daemon, pid file)

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> str:
        p = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode:
            raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr[-2000:]}")
        return p.stdout

    def _munge_ok(self) -> bool:
        if not (_which("munge") and _which("unmunge")):
            return False
        p = subprocess.run(
            f"{_which('munge')} -n | {_which('unmunge')}", shell=True, capture_output=True
        )
        return p.returncode == 0

    def _wait(self, what: str, ready, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if ready():
                return
            time.sleep(0.3)
        logs = ""
        for name in ("slurmctld.log", "slurmd.log"):
            path = os.path.join(self.scratch, name)
            if os.path.exists(path):
                with open(path) as f:
                    logs += f"\n--- {name}\n" + f.read()[-1500:]
        self.stop()
        raise SlurmUnavailable(f"{what} did not come up within {timeout:.0f} s{logs}")

    def start(self) -> LocalSlurm:
        install_if_missing()
        try:
            socket.gethostbyname(self.node)
        except OSError as e:
            raise SlurmUnavailable(f"this host's name {self.node!r} does not resolve: {e}") from e
        if not self._munge_ok():
            if os.geteuid() != 0:
                raise SlurmUnavailable("munged is not running and starting it needs root")
            if not os.path.exists("/etc/munge/munge.key"):
                subprocess.run([_which("mungekey"), "--create"], check=True)
                shutil.chown("/etc/munge/munge.key", "munge", "munge")
            os.makedirs("/run/munge", exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", _which("munged")], check=True)
            self._started.append(("munged", "/run/munge/munged.pid"))
            self._wait("munged", self._munge_ok)
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.scratch, sub), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write(_slurm_conf(self.scratch, self.node))
        subprocess.run([_which("slurmctld"), "-f", self.conf, "-i"], env=self.env, check=True)
        self._started.append(("slurmctld", os.path.join(self.scratch, "slurmctld.pid")))
        subprocess.run(
            [_which("slurmd"), "-f", self.conf, "-N", self.node], env=self.env, check=True
        )
        self._started.append(("slurmd", os.path.join(self.scratch, "slurmd.pid")))
        self._wait("the SLURM node", self._node_idle)
        return self

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%t", check=False, timeout=10)
        return out.strip() == "idle"

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...)."""
        out = self.run("scontrol", "-o", "show", "job", job_id)
        fields = {}
        for item in out.split():
            key, _, value = item.partition("=")
            fields[key] = value
        return fields

    def stop(self) -> None:
        """SIGTERM to each daemon this object started (by its pid file), newest first."""
        pids = []
        for _name, pid_file in reversed(self._started):
            try:
                with open(pid_file) as f:
                    pid = int(f.read().strip())
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
            except (OSError, ValueError):
                pass  # gone already, or never wrote its pid: nothing of ours to stop
        deadline = time.time() + 15
        while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.2)
        self._started.clear()
