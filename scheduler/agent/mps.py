"""NVIDIA MPS on the node: one control daemon per GPU the agent shares through MPS (Django-free).

The agent starts `nvidia-cuda-mps-control -d` once per GPU with that GPU alone visible
(CUDA_VISIBLE_DEVICES: its UUID, as NVIDIA recommends, since the MPS server renumbers the
devices it sees) and a pipe and log directory of its own, so the GPUs' daemons never meet. It
watches each daemon through the pid file the daemon writes in its pipe directory and starts it
again if it died; on exit it sends `quit` to each daemon no running task still uses (one that
is still in use is left to the next agent, which adopts it). A task holding a share of such a
GPU gets the daemon's pipe directory and its limits in its environment (`client_env`).

The pipe directories live under the work dir (0711) and are 0755: tasks run as other accounts
and must reach the daemon's pipes. The log directories live in the agent's private state dir.
The control binary is a flag (`--mps-control`), so tests run this module against a script that
behaves as the real one does.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from scheduler.agent.isolation import TASK_PATH

log = logging.getLogger("berth.agent")
CONTROL = "nvidia-cuda-mps-control"
CONTROL_ENV = "BERTH_MPS_CONTROL"  # the control binary, when not on PATH
PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the daemon in its pipe directory
CHECK_SECONDS = 2.0  # how often the daemons are looked at (a dead one is started again)
START_SECONDS = 10.0  # how long `-d` and the daemon's pid file may take
STOP_SECONDS = 5.0  # how long a daemon may take to end after `quit`


def find_control(flag: str | None = None) -> str | None:
    """The control binary: the flag, else $BERTH_MPS_CONTROL, else the one on PATH (None:
    this node cannot offer MPS)."""
    chosen = (flag or os.environ.get(CONTROL_ENV, "")).strip()
    if chosen:
        return chosen if os.access(chosen, os.X_OK) and os.path.isfile(chosen) else None
    return shutil.which(CONTROL, path=f"{os.environ.get('PATH', '')}:{TASK_PATH}")


def thread_percentage(share: float) -> int:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for a share: share x 100 rounded up, 1 to 100 (the
    rounding first drops float noise: 0.07 x 100 is 7.000000000000001)."""
    return max(1, min(100, math.ceil(round(share * 100, 6))))


class MpsDaemons:
    """The control daemons of this node's MPS GPUs, by GPU index."""

    def __init__(self, control: str, pipe_base: Path, log_base: Path) -> None:
        self.control = control
        self.pipe_base = pipe_base
        self.log_base = log_base
        self.devices: dict[int, str] = {}  # index -> what CUDA_VISIBLE_DEVICES names it by
        self.check_at = 0.0
        self.check_seconds = CHECK_SECONDS

    def pipe_dir(self, index: int) -> Path:
        return self.pipe_base / f"gpu{index}"

    def log_dir(self, index: int) -> Path:
        return self.log_base / f"gpu{index}"

    def daemon_env(self, index: int) -> dict[str, str]:
        """The daemon's environment, from scratch: none of the agent's own variables."""
        env = {
            # The daemon starts nvidia-cuda-mps-server, which lives beside it.
            "PATH": f"{os.path.dirname(self.control) or '/usr/bin'}:{TASK_PATH}",
            "CUDA_VISIBLE_DEVICES": self.devices[index],
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(index)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(index)),
        }
        if os.environ.get("LD_LIBRARY_PATH"):  # where the driver's libraries may live
            env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
        return env

    def pid(self, index: int) -> int | None:
        """The daemon's pid while it runs (from its pid file, checked against /proc)."""
        try:
            pid = int((self.pipe_dir(index) / PID_FILE).read_text().strip())
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return None
        # A pid file left by a dead daemon may name a reused pid: it must be the control.
        return pid if os.path.basename(self.control).encode() in cmdline else None

    def start(self, index: int) -> bool:
        """Start the daemon of GPU `index`; whether it runs."""
        self.pipe_base.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.pipe_dir(index).mkdir(mode=0o755, exist_ok=True)
        self.pipe_dir(index).chmod(0o755)
        self.log_base.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.log_dir(index).mkdir(mode=0o700, exist_ok=True)
        try:
            done = subprocess.run([self.control, "-d"], env=self.daemon_env(index),
                                  stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=START_SECONDS, check=False)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            log.error("GPU %s: could not start the MPS control daemon: %s", index, exc)
            return False
        deadline = time.monotonic() + START_SECONDS
        while done.returncode == 0 and self.pid(index) is None and time.monotonic() < deadline:
            time.sleep(0.02)  # `-d` returns once it forked; the daemon writes its pid file
        if self.pid(index) is None:
            text = (done.stderr or done.stdout).decode(errors="replace").strip()[:300]
            log.error("GPU %s: the MPS control daemon did not start (exit %s) %s",
                      index, done.returncode, text)  # fmt: skip
            return False
        log.info("GPU %s: MPS control daemon running as pid %s", index, self.pid(index))
        return True

    def ensure(self, devices: Mapping[int, str]) -> list[int]:
        """Serve exactly these GPUs (index -> CUDA name): start each one's daemon unless it
        runs (adopting one a previous agent left), stop those of GPUs no longer served.
        Returns the indices whose daemon was started now."""
        for index in set(self.devices) - set(devices):
            self.stop(index)
            self.devices.pop(index, None)
        self.devices.update(devices)
        return [i for i in sorted(self.devices) if self.pid(i) is None and self.start(i)]

    def check(self) -> list[int]:
        """Every CHECK_SECONDS: start again any daemon that died; the indices restarted."""
        now = time.monotonic()
        if now < self.check_at or not self.devices:
            return []
        self.check_at = now + self.check_seconds
        restarted = []
        for index in sorted(self.devices):
            if self.pid(index) is None:
                log.warning("GPU %s: the MPS control daemon is gone; starting it again", index)
                if self.start(index):
                    restarted.append(index)
        return restarted

    def stop(self, index: int) -> bool:
        """`echo quit | nvidia-cuda-mps-control` for this GPU; whether its daemon ended."""
        pid = self.pid(index)
        if pid is None:
            return True
        try:
            subprocess.run([self.control], input=b"quit\n", env=self.daemon_env(index),
                           capture_output=True, timeout=STOP_SECONDS, check=False)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("GPU %s: could not ask the MPS control daemon to quit: %s", index, exc)
            return False
        deadline = time.monotonic() + STOP_SECONDS
        while self.pid(index) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.pid(index) is None

    def stop_all(self, in_use: set[int]) -> None:
        """The agent exits: stop every daemon except those of GPUs in `in_use` (running tasks
        that outlive the agent still talk to them; the next agent adopts them)."""
        for index in sorted(self.devices):
            if index in in_use:
                log.info("GPU %s: MPS control daemon left running for its tasks", index)
            elif not self.stop(index):
                log.warning("GPU %s: the MPS control daemon did not quit", index)

    def client_env(self, index: int, share: float, memory: int) -> dict[str, str]:
        """What a task holding `share` of GPU `index` gets: the daemon's pipe directory, its
        thread percentage and (when `memory` bytes are known) its pinned device memory
        limit. The task sees this one GPU, as device 0 of the daemon's: the limit names 0."""
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(index)),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(thread_percentage(share)),
        }
        if memory > 0:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, memory // 2**20)}M"
        return env
