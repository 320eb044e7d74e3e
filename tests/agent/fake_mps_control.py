"""A stand-in for `nvidia-cuda-mps-control`, behaving as the real one does where the agent
can tell (tests/agent/test_gpu_sharing.py copies it into a temporary bin dir under that name).

`-d` starts the control daemon in the background and returns: the daemon writes its pid to
nvidia-cuda-mps-control.pid in $CUDA_MPS_PIPE_DIRECTORY, listens on a `control` pipe there and
ends on `quit`; a second `-d` for the same pipe directory fails while one runs. Without
arguments it is the client: it sends each line of stdin to the daemon, or fails when none
runs. Every call and the daemon's commands are recorded, one JSON line each, in
$CUDA_MPS_LOG_DIRECTORY/control.log (where the real daemon keeps its control.log).
"""

import json
import os
import sys
from pathlib import Path

PIPE = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
LOG = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
PID_FILE = PIPE / "nvidia-cuda-mps-control.pid"


def record(**what):
    with (LOG / "control.log").open("a") as handle:
        handle.write(json.dumps(what) + "\n")


def running():
    try:
        pid = int(PID_FILE.read_text())
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, ValueError):
        return None
    return None if state == "Z" else pid


def daemon():
    """Detach as a daemon does, then serve the control pipe until `quit`."""
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    control = PIPE / "control"
    if not control.exists():
        os.mkfifo(control, 0o666)
    PID_FILE.write_text(str(os.getpid()))
    while True:
        with control.open() as pipe:
            for line in pipe:
                record(command=line.strip(), pid=os.getpid())
                if line.strip() == "quit":
                    PID_FILE.unlink()
                    os._exit(0)


def main():
    env = {k: v for k, v in os.environ.items()}
    record(args=sys.argv[1:], env=env, pid=os.getpid())
    if sys.argv[1:] == ["-d"]:
        if running():
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        daemon()
        return 0
    if not running():
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with (PIPE / "control").open("w") as pipe:
        pipe.write(sys.stdin.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
