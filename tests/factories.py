"""Rows as the scheduler would leave them, for tests of the loop's own units."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from scheduler.models import Allocation, Device, Job, Node, Queue, Task, UsageRecord
from scheduler.states.names import JobState, TaskState

GI = 1024**3


def make_node(
    name: str = "node-1",
    *,
    gpus: int = 0,
    cpu: int = 8000,
    memory: int = 32 * GI,
    labels: dict[str, str] | None = None,
    **fields: Any,
) -> Node:
    fields.setdefault("last_heartbeat", timezone.now())
    node = Node.objects.create(name=name, cpu=cpu, memory=memory, labels=labels or {}, **fields)
    for index in range(gpus):
        Device.objects.create(node=node, index=index, uuid=f"{name}-gpu{index}", model="test")
    return node


def make_job(
    owner: User,
    name: str = "job",
    *,
    replicas: int = 1,
    cpu: int = 1000,
    memory: int = GI,
    gpu: int = 0,
    command: str = "true",
    queue: str = "default",
    **fields: Any,
) -> Job:
    """A job with one task group of `replicas` tasks, all Pending."""
    spec = {
        "name": name,
        "queue": queue,
        "tasks": [
            {
                "name": "main",
                "replicas": replicas,
                "command": command,
                "env": {},
                "resources": {"cpu": str(cpu // 1000), "memory": "1Gi", "gpu": gpu},
                "node_selector": fields.pop("node_selector", {}),
            }
        ],
    }
    fields.setdefault("min_available", replicas)
    # get_or_create: a transactional test before this one may have flushed the migration's
    # default queue.
    the_queue = Queue.objects.get_or_create(name=queue)[0]
    job = Job.objects.create(name=name, owner=owner, queue=the_queue, spec=spec, **fields)
    for index in range(replicas):
        Task.objects.create(job=job, group="main", index=index, cpu=cpu, memory=memory, gpu=gpu)
    return job


def place(job: Job, node: Node, *, state: str = TaskState.RUNNING, devices: int = 0) -> None:
    """Put every task of `job` on `node` as the scheduler and an agent would."""
    free = list(Device.objects.filter(node=node, allocations__isnull=True).order_by("index"))
    now = timezone.now()
    for task in job.tasks.all():
        held = [free.pop(0) for _ in range(devices)]
        if task.state == TaskState.PENDING and state != TaskState.ASSIGNED:
            # Through Assigned, as the scheduler and the agent move it (the test database
            # refuses a move no state machine allows: scheduler/states/).
            Task.objects.filter(pk=task.pk).update(state=TaskState.ASSIGNED)
        task.state = state
        task.node = node
        task.device_indices = [d.index for d in held]
        task.assigned_at = now
        task.started_at = now if state == TaskState.RUNNING else None
        task.save()
        for device in held:
            Allocation.objects.create(device=device, task=task)
    if state == TaskState.RUNNING:
        job.state = JobState.RUNNING
        job.started_at = now
        job.save()


def finish_task(task: Task, state: str, exit_code: int | None = None) -> None:
    """What an agent's heartbeat does when a task stops: final state, devices released."""
    if task.state == TaskState.PENDING and state != TaskState.KILLED:
        Task.objects.filter(pk=task.pk).update(state=TaskState.ASSIGNED)  # placed first
    task.state = state
    task.exit_code = exit_code
    task.finished_at = timezone.now()
    task.save()
    Allocation.objects.filter(task=task).delete()


def make_usage(
    user: User,
    *,
    queue: str = "default",
    gpu_seconds: float = 3600.0,
    days_ago: int = 0,
    job_id: int = 1,
    task_id: int | None = None,
) -> UsageRecord:
    """A task attempt that succeeded after an hour on one cpu, ending `days_ago` days ago (a
    minute before now); `task_id` defaults to the next unused number."""
    end = timezone.now() - timedelta(days=days_ago, minutes=1)
    return UsageRecord.objects.create(
        user=user, username=user.username, queue=queue, job_id=job_id,
        task_id=task_id or UsageRecord.objects.count() + 1, attempt=0, state="Succeeded",
        started_at=end - timedelta(hours=1), finished_at=end, day=end.date(),
        wall_seconds=3600, cpu_seconds=3600, gpu_seconds=gpu_seconds,
    )  # fmt: skip


def seed(queryset: Any, **fields: Any) -> int:
    """Write `fields` onto `queryset`'s rows whatever their state: a test's starting point,
    not a move. The test database refuses a state move no state machine allows
    (scheduler/states/, tests/conftest.py); seeding skips that check for this one UPDATE
    (PostgreSQL's replica role fires no ordinary trigger)."""
    from django.db import connection, transaction

    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL session_replication_role = replica")
        count = queryset.update(**fields)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL session_replication_role = origin")
    return int(count)
