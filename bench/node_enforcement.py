"""What enforcement costs on a node: task start latency and the agent's CPU per task, with
each task in a cgroup of its own and a private /tmp ("on") and without either ("off").

Runs a real agent (scheduler.agent.runtime, no server: orders are handed to it directly, as
a lease brings them) as root, starts N short tasks one after another in each mode, and prints
one JSON object:

- start latency: from the agent taking the start order to the command's first line of output
  (the wrapper's start, the cgroup, the gate, unshare/mount/setpriv, bash -l, the command);
- agent CPU per task: the agent process's own user+system CPU from the order to the end
  reported (start, polling, the end: kill of the cgroup, usage read, removal), not the task's.

    sudo .venv/bin/python bench/node_enforcement.py --tasks 30
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.agent.cgroups import Found  # noqa: E402  (Django-free)
from scheduler.agent.fence import Fence  # noqa: E402
from scheduler.agent.runtime import Agent  # noqa: E402

POLL = 0.002  # how often this bench looks for the first output (finer than the agent's 50 ms)


class BenchAgent(Agent):
    """An agent without a server: every request is answered with nothing to do."""

    def _post(self, path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        return {}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_mode(enforce: bool, tasks: int, base: Path) -> dict[str, Any]:
    """Start `tasks` tasks one at a time; latency and agent CPU of each."""
    fence = (
        Fence("required", base_name="berth-bench")
        if enforce
        else Fence("best-effort", base_name="berth-bench", finder=lambda n: Found(None, "off"))
    )
    agent = BenchAgent("http://bench.invalid", "join", name="bench", work_dir=base / "work",
                       fence=fence, keep_work_dirs=0)  # fmt: skip
    agent.token = "t"
    agent.prepare()
    if not enforce:
        agent.tmp_tools = None
    latencies, cpu = [], []
    for i in range(tasks):
        order = {"id": i + 1, "attempt": 0, "command": "echo up", "env": {},
                 "resources": {"cpu": 1000, "memory": 256 * 2**20}}  # fmt: skip
        cpu_before, started = _cpu(), time.perf_counter()
        agent.start(order)
        task = agent.tasks[i + 1]
        while task.output.stat().st_size == 0 and task.state == "Running":
            time.sleep(POLL)
            agent._poll()
        latencies.append(time.perf_counter() - started)
        while task.state == "Running":
            time.sleep(POLL)
            agent._poll()
        agent.step()  # report (to nobody), forget it, remove its files
        cpu.append(_cpu() - cpu_before)
    agent.fence.close()
    return {
        "start_latency_ms": _summary([x * 1000 for x in latencies]),
        "agent_cpu_ms_per_task": _summary([x * 1000 for x in cpu]),
        "enforced": agent.fence.describe()["enforced"],
        "private_tmp": agent.tmp_tools is not None,
    }


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 2),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
        "max": round(ordered[-1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=30)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run it as root: enforcement needs cgroups and namespaces")
    base = Path(tempfile.mkdtemp(prefix="berth-bench-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        result = {
            "tasks": args.tasks,
            "kernel": os.uname().release,
            "on": run_mode(True, args.tasks, base / "on"),
            "off": run_mode(False, args.tasks, base / "off"),
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
