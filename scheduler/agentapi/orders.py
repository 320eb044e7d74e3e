"""Orders for an agent, in a report's or a lease's answer: tasks to start (what each runs, its
environment, its peers and devices) and tasks to kill."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

from django.conf import settings

from scheduler.agent import wire
from scheduler.agent.wire import TaskReport
from scheduler.intake.specs import job_app
from scheduler.jobs.arrays import array_env
from scheduler.jobs.webapps import app_env
from scheduler.models import Allocation, Node, Task
from scheduler.states.names import TASK_ON_NODE, TaskState


def wanted(task: Task | TaskRow | None, report: TaskReport, node: Node) -> bool:
    """Is this report about the attempt the server wants running on this node?"""
    return (
        task is not None
        and task.node_id == node.pk
        and task.attempt == report.attempt
        and task.state in TASK_ON_NODE
    )


def kill_order(task_id: int, attempt: int) -> wire.KillOrder:
    return wire.KillOrder(task_id, attempt, settings.BERTH_KILL_GRACE_SECONDS)


# What a start order reads of a task, its job and its owner (to_start, _start_message).
START_FIELDS = ("attempt", "group", "index", "cpu", "memory", "gpu_memory", "job", "job__name",
                "job__spec",
                "job__walltime", "job__array_parent", "job__array_index", "job__owner",
                "job__owner__username")  # fmt: skip


class TaskRow(NamedTuple):
    """What deciding a lease's orders reads of a task (no model, no job): sql.LEASE_COLUMNS."""

    pk: int
    node_id: int | None
    attempt: int
    state: str
    kill_requested: bool


def to_start(ids: list[int], node: Node) -> list[Task]:
    """The tasks of `ids` still Assigned here, with their jobs and owners: what a start
    order says of them (START_FIELDS), not whole rows (a job has some forty columns)."""
    if not ids:
        return []
    tasks = (
        Task.objects.select_related("job__owner")
        .filter(pk__in=ids, node=node, state=TaskState.ASSIGNED, kill_requested=False)
        .only(*START_FIELDS)
    )
    order = {pk: i for i, pk in enumerate(ids)}
    return sorted(tasks, key=lambda t: order[t.pk])


def start_messages(tasks: list[Task], node: Node) -> list[dict[str, Any]]:
    """The start orders of `tasks` (placed on `node`, their jobs and owners loaded), with
    their peers and devices read for all of them at once: three queries whatever their
    number, not three per task."""
    if not tasks:
        return []
    peers: dict[int, list[tuple[int, str, str, str, int]]] = defaultdict(list)
    rows = Task.objects.filter(job_id__in={t.job_id for t in tasks}).values_list(
        "job_id", "pk", "node__hostname", "node__name", "group", "index"
    )
    for job_id, *peer in rows:
        peers[job_id].append(tuple(peer))  # type: ignore[arg-type]
    devices: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    held = Allocation.objects.filter(task__in=[t.pk for t in tasks])
    for task_id, *row in held.values_list("task_id", "device__index", "share", "mig"):
        devices[task_id].append(tuple(row))  # type: ignore[arg-type]
    return [_start_message(t, node, peers[t.job_id], sorted(devices[t.pk])) for t in tasks]


def _start_message(
    task: Task,
    node: Node,
    peers: list[tuple[int, str, str, str, int]],
    held: list[tuple[int, int, str]],
) -> dict[str, Any]:
    """One start order; `held` is (device index, share in thousandths, MIG instance UUID or
    "") by index."""
    devices = [index for index, _, _ in held]
    job = task.job
    spec = job.spec
    group: dict[str, Any] = next(
        (g for g in spec.get("tasks", []) if g.get("name") == task.group), {}
    )
    # Ranks follow the spec: its task groups in order, each group's tasks by index.
    position = {g.get("name"): i for i, g in enumerate(spec.get("tasks", []))}
    tasks = sorted(peers, key=lambda t: (position.get(t[3], len(position)), t[3], t[4]))
    rank = next(i for i, t in enumerate(tasks) if t[0] == task.pk)
    master = tasks[0][1] or tasks[0][2] or node.hostname or node.name
    env = dict(group.get("env", {}))
    env.update(
        {
            "BERTH_JOB_ID": str(job.pk),
            "BERTH_JOB_NAME": job.name,
            "BERTH_TASK_GROUP": task.group,
            "BERTH_TASK_INDEX": str(rank),
            "BERTH_ATTEMPT": str(task.attempt),
            "RANK": str(rank),
            "WORLD_SIZE": str(len(tasks)),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(20000 + job.pk % 20000),
            "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in devices),
            **array_env(job),  # BERTH_ARRAY_INDEX etc. for an array's element
        }
    )
    # The job's app runs in its first task (rank 0), on this node's registered address.
    app = job_app(spec) if rank == 0 else ""
    if app:
        env.update(app_env(job.pk, app, task.pk, task.attempt, node.address or "127.0.0.1"))
    return wire.StartOrder(
        task.pk, task.attempt, job.pk, job.name, task.group, task.index,
        group.get("command", ""), job.owner.username, env, devices, job.walltime,
        # What the agent holds the task to (its cgroup): millicores, bytes, processes.
        {"cpu": task.cpu, "memory": task.memory, **_pids(group)},
        [share / 1000 for _, share, _ in held], task.gpu_memory or None,
        [mig for _, _, mig in held] if any(mig for _, _, mig in held) else [], app=app,
    ).to_json()  # fmt: skip


def _pids(group: dict[str, Any]) -> dict[str, int]:
    """The task group's own pids limit, when its spec sets one (else the agent's default)."""
    pids = (group.get("resources") or {}).get("pids")
    if isinstance(pids, int) and not isinstance(pids, bool) and pids > 0:
        return {"pids": pids}
    return {}
