"""Many fake nodes in one process, over the same HTTP protocol as real agents.

A task "runs" for BERTH_SIM_DURATION seconds from its env (default: half its walltime, or
1 s) and exits with BERTH_SIM_EXIT (default 0), writing one line of output.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from scheduler.agent.runtime import Agent, ServerError

log = logging.getLogger("berth.simagent")


@dataclass
class SimTask:
    id: int
    attempt: int
    ends_at: float
    exit_code: int
    state: str = "Running"
    logged: bool = False


@dataclass
class SimNode:
    agent: Agent
    cpu: int
    memory: int
    gpus: int
    tasks: dict[int, SimTask] = field(default_factory=dict)
    next_beat: float = 0.0


def _duration(order: dict[str, Any]) -> float:
    env = order.get("env", {})
    if "BERTH_SIM_DURATION" in env:
        return float(env["BERTH_SIM_DURATION"])
    walltime = order.get("walltime")
    return float(walltime) / 2 if walltime else 1.0


class SimCluster:
    def __init__(
        self, server: str, join_token: str, nodes: int, gpus: int, cpu: int, memory: int,
        prefix: str = "sim", labels: dict[str, str] | None = None, workers: int = 8,
    ) -> None:  # fmt: skip
        self.nodes = [
            SimNode(
                Agent(server, join_token, name=f"{prefix}-{i:04d}", labels=labels or {}),
                cpu,
                memory,
                gpus,
            )  # fmt: skip
            for i in range(nodes)
        ]
        self.workers = workers

    def register(self, node: SimNode) -> None:
        answer = node.agent._post(
            "register/",
            {
                "name": node.agent.name,
                "cpu": f"{node.cpu}m",
                "memory": node.memory,
                "labels": node.agent.labels,
                "devices": [
                    {"index": i, "uuid": f"sim-{node.agent.name}-{i}", "model": "sim"}
                    for i in range(node.gpus)
                ],
                "hostname": node.agent.name,
                "version": "berth-simagent/1",
            },
            f"Bearer {node.agent.join_token}",
        )
        node.agent.token = answer["token"]
        node.agent.interval = float(answer.get("heartbeat_interval", 2.0))

    def beat(self, node: SimNode) -> None:
        now = time.monotonic()
        if not node.agent.token:
            self.register(node)
        for task in node.tasks.values():
            if task.state == "Running" and now >= task.ends_at:
                task.state = "Succeeded" if task.exit_code == 0 else "Failed"
            if task.state != "Running" and not task.logged:
                node.agent._post(
                    f"tasks/{task.id}/log/",
                    {"attempt": task.attempt, "offset": 0,
                     "data": f"simulated task {task.id} on {node.agent.name}: exit {task.exit_code}\n"},  # noqa: E501
                    f"Node {node.agent.token}",
                )  # fmt: skip
                task.logged = True
        reported = list(node.tasks.values())
        answer = node.agent._post(
            "heartbeat/",
            {"tasks": [{"id": t.id, "attempt": t.attempt, "state": t.state,
                        "exit_code": None if t.state == "Running" else t.exit_code}
                       for t in reported]},
            f"Node {node.agent.token}",
        )  # fmt: skip
        for task in reported:
            if task.state != "Running":
                node.tasks.pop(task.id, None)
        for order in answer.get("kill", []):
            target = node.tasks.get(int(order["id"]))
            if target is not None and target.state == "Running":
                target.state, target.exit_code = "Killed", 143
        for order in answer.get("start", []):
            task_id = int(order["id"])
            if task_id in node.tasks and node.tasks[task_id].attempt == int(order["attempt"]):
                continue
            node.tasks[task_id] = SimTask(
                task_id, int(order["attempt"]), now + _duration(order),
                int(order.get("env", {}).get("BERTH_SIM_EXIT", 0)),
            )  # fmt: skip
        # Report a finished task at once rather than a whole interval later.
        soonest = min((t.ends_at for t in node.tasks.values()), default=now + node.agent.interval)
        node.next_beat = min(now + node.agent.interval, max(soonest, now + 0.05))

    def run(self, stop: threading.Event) -> None:
        with ThreadPoolExecutor(self.workers) as pool:
            while not stop.is_set():
                now = time.monotonic()
                due = [n for n in self.nodes if n.next_beat <= now]
                for node, error in zip(due, pool.map(self._safe_beat, due), strict=True):
                    if error:
                        node.next_beat = now + 1.0
                stop.wait(0.02 if due else 0.05)

    def _safe_beat(self, node: SimNode) -> str:
        try:
            self.beat(node)
        except ServerError as exc:
            if exc.status == 401:
                node.agent.token = ""
            log.warning("node %s: %s", node.agent.name, exc)
            return str(exc)
        except OSError as exc:
            log.warning("node %s: server unreachable (%s)", node.agent.name, exc)
            return str(exc)
        except Exception as exc:  # one node's trouble never stops the others
            log.exception("node %s: heartbeat failed", node.agent.name)
            return str(exc) or type(exc).__name__
        return ""
