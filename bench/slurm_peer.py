"""Slurm on this machine as the side-by-side peer of bench/e2e.py.

Starts munged, slurmctld and slurmd from Debian's `slurm-wlm` with a throwaway single-host
configuration in a temporary directory, submits N `sleep D` batch jobs with `sbatch --wrap` from
C concurrent clients, waits until the queue is empty and reports the same figures as Berth's
run (accepted/s, finished/s end to end, submit latency, errors). Needs root (slurmd runs jobs
as the submitting user) and the `sbatch`, `slurmctld`, `slurmd`, `munged` binaries; when they
are missing `available()` says why and bench/e2e.py reports the peer as skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from processes import stop_groups

BINARIES = ("sbatch", "squeue", "slurmctld", "slurmd", "munged")


def available() -> str | None:
    """None when Slurm can run here, else the reason it cannot."""
    missing = [b for b in BINARIES if not shutil.which(b)]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd needs root"
    return None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class SlurmCluster:
    """A one-host Slurm cluster under `work`, stopped by `stop()`."""

    def __init__(self, work: Path, slots: int) -> None:
        self.work = work
        self.slots = slots
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(work / "slurm.conf")}

    def _write_config(self) -> None:
        for sub in ("state", "spool", "log", "munge"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        w = self.work
        (w / "slurm.conf").write_text(
            "\n".join(
                [
                    "ClusterName=bench",
                    "SlurmctldHost=localhost",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={w}/munge/munge.socket.2",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={w}/state",
                    f"SlurmdSpoolDir={w}/spool",
                    f"SlurmctldPidFile={w}/slurmctld.pid",
                    f"SlurmdPidFile={w}/slurmd.pid",
                    f"SlurmctldLogFile={w}/log/slurmctld.log",
                    f"SlurmdLogFile={w}/log/slurmd.log",
                    "SlurmctldPort=16817",
                    "SlurmdPort=16818",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerType=sched/backfill",
                    "SlurmdParameters=config_overrides",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "JobCompType=jobcomp/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MaxJobCount=100000",
                    f"NodeName=localhost CPUs={self.slots} State=UNKNOWN",
                    "PartitionName=bench Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def start(self) -> None:
        self._write_config()
        w = self.work
        key = w / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(
            "munged",
            ["munged", "--foreground", "--force", f"--key-file={key}",
             f"--socket={w}/munge/munge.socket.2", f"--pid-file={w}/munge/munged.pid",
             f"--log-file={w}/log/munged.log", f"--seed-file={w}/munge/munge.seed"],
        )  # fmt: skip
        time.sleep(0.5)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(w / "slurm.conf")])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(w / "slurm.conf")])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True
            )
            if out.returncode == 0 and out.stdout.strip().startswith("idle"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"Slurm did not come up; see {w}/log")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.work / "log" / f"{name}.out", "wb")  # noqa: SIM115 - lives with the proc
        self.procs.append(
            subprocess.Popen(
                cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )  # fmt: skip
        )

    def queued(self) -> int:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True,
                             text=True)  # fmt: skip
        return len(out.stdout.split()) if out.returncode == 0 else -1

    def stop(self) -> None:
        stop_groups(reversed(self.procs))


def run(jobs: int, clients: int, duration: float, slots: int, timeout: float) -> dict[str, Any]:
    """Submit `jobs` sleeps from `clients` threads; the figures bench/e2e.py prints for Berth."""
    reason = available()
    if reason:
        return {"skipped": reason}
    work = Path(tempfile.mkdtemp(prefix="berth-slurm-"))
    work.chmod(0o755)
    cluster = SlurmCluster(work, slots)
    try:
        cluster.start()
        latencies: list[float] = []
        errors = 0
        out_dir = work / "out"
        out_dir.mkdir()

        def submit(_: int) -> None:
            nonlocal errors
            started = time.monotonic()
            done = subprocess.run(
                ["sbatch", "--quiet", "--parsable", "-n1", "-o", f"{out_dir}/%j.out",
                 "--wrap", f"sleep {duration}"],
                env=cluster.env, capture_output=True, text=True,
            )  # fmt: skip
            if done.returncode == 0:
                latencies.append(time.monotonic() - started)
            else:
                errors += 1

        t0 = time.monotonic()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(submit, range(jobs)))
        submit_s = time.monotonic() - t0
        deadline = time.monotonic() + timeout
        while cluster.queued() != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        total_s = time.monotonic() - t0
        finished = len(list(out_dir.glob("*.out")))
        return {
            "peer": subprocess.run(
                ["sbatch", "--version"], env=cluster.env, capture_output=True, text=True
            ).stdout.strip(),  # fmt: skip
            "slots": slots,
            "jobs": jobs,
            "clients": clients,
            "errors": errors,
            "accepted_per_s": round((jobs - errors) / submit_s, 1),
            "finished_per_s": round(finished / total_s, 1),
            "finished": finished,
            "submit_latency_ms": {
                "p50": round(_percentile(latencies, 0.5) * 1000, 1),
                "p99": round(_percentile(latencies, 0.99) * 1000, 1),
            },
            "end_to_end_seconds": round(total_s, 2),
        }
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
