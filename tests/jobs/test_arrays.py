"""Job arrays in the scheduler loop: the %K limit, bulk cancel, the parent's state, TTL, and
the element's index in its tasks' environment (scheduler/jobs/arrays.py,
scheduler/cycle/loop.py)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler import lifecycle
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.jobs.submit import submit_job
from scheduler.models import Event, Job, Task
from scheduler.states.names import TASK_ON_NODE, JobRequest, JobState, TaskState
from tests.agentapi.test_protocol import beat, register
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def submit_array(owner: Any, array: str, *, replicas: int = 1, **fields: Any) -> Job:
    return submit_job(owner, {
        "name": "sweep", "array": array, **fields,
        "tasks": [{"name": "main", "replicas": replicas, "command": "echo $BERTH_ARRAY_INDEX",
                   "resources": {"cpu": "1", "memory": "1Gi"}}],
    })  # fmt: skip


def elements(parent: Job) -> Any:
    return Job.objects.filter(array_parent=parent).order_by("array_index")


def on_node(parent: Job) -> set[int]:
    """Indices of the elements that hold a node (tasks Assigned or Running)."""
    rows = Task.objects.filter(job__array_parent=parent, state__in=TASK_ON_NODE)
    return {int(i) for i in rows.values_list("job__array_index", flat=True) if i is not None}


def agent_runs_assigned() -> None:
    """What agents do with new assignments: start them."""
    Task.objects.filter(state=TaskState.ASSIGNED).update(
        state=TaskState.RUNNING, started_at=timezone.now()
    )


def agent_finishes(parent: Job, index: int, state: str = TaskState.SUCCEEDED) -> None:
    Task.objects.filter(job__array_parent=parent, job__array_index=index).update(
        state=state, exit_code=0 if state == TaskState.SUCCEEDED else 1,
        finished_at=timezone.now(),
    )  # fmt: skip


def test_the_limit_holds_while_elements_run_and_finish(owner):
    make_node("big", cpu=64_000, memory=256 * 2**30)
    parent = submit_array(owner, "0-9%3")
    finished: list[int] = []
    for _ in range(30):
        run_scheduler_cycle()
        assert len(on_node(parent)) <= 3
        active = elements(parent).filter(
            state__in=(JobState.PENDING, JobState.RUNNING), hold_reason=""
        )
        assert active.count() <= 3
        agent_runs_assigned()
        running = sorted(on_node(parent))
        if running:
            agent_finishes(parent, running[0])  # one element ends per cycle
            finished.append(running[0])
        parent.refresh_from_db()
        if parent.state == JobState.SUCCEEDED:
            break
    assert parent.state == JobState.SUCCEEDED, parent.hold_reason
    # Released lowest index first, every element ran once.
    assert finished == list(range(10))
    assert set(elements(parent).values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert parent.array_counts == {"states": {"Succeeded": 10}, "held": 0}
    assert parent.finished_at is not None and not parent.hold_reason


def test_held_elements_say_why_and_the_parent_summarises(owner, api):
    make_node("big", cpu=64_000, memory=256 * 2**30)
    parent = submit_array(owner, "0-9%2")
    run_scheduler_cycle()
    agent_runs_assigned()
    run_scheduler_cycle()
    held = api(owner).get(f"/api/v1/jobs/{elements(parent).last().pk}/").json()
    assert held["pending_reasons"][0] == "array limit: 2/2 active"
    body = api(owner).get(f"/api/v1/jobs/{parent.pk}/").json()
    assert body["state"] == "Running"
    assert body["array"]["counts"] == {"Running": 2, "Pending": 8}
    assert body["array"]["held"] == 8
    assert body["array"]["indices"] == {"Pending": "2-9", "Running": "0-1"}
    assert "held by the limit of 2" in body["pending_reasons"][0]


def test_the_parent_is_never_a_scheduling_candidate(owner):
    make_node("big", cpu=64_000, memory=256 * 2**30)
    parent = submit_array(owner, "0-1")
    report = run_scheduler_cycle()
    assert report.counts["placed"] == 2 and not report.errors
    parent.refresh_from_db()
    assert parent.pending_message == "" and not parent.tasks.exists()
    agent_runs_assigned()
    run_scheduler_cycle()
    parent.refresh_from_db()
    assert parent.state == JobState.RUNNING and parent.started_at is not None
    assert run_scheduler_cycle().counts["placed"] == 0  # a Running parent holds nothing either


def _cancelled_count(staff: Any) -> float:
    from tests.ops.test_metrics import _scrape

    return _scrape(staff)[
        ("berth_jobs_finished_total", (("queue", "default"), ("state", "Cancelled")))
    ]


def test_cancel_on_the_parent_cancels_pending_elements_in_bulk_and_stops_running_ones(owner, staff):
    make_node("small", cpu=2_000, memory=8 * 2**30)
    parent = submit_array(owner, "0-499")
    run_scheduler_cycle()
    agent_runs_assigned()
    assert on_node(parent) == {0, 1}
    client = APIClient()
    client.force_authenticate(owner)
    assert client.post(f"/api/v1/jobs/{parent.pk}/cancel/").status_code == 202
    run_scheduler_cycle()
    counts = Counter(elements(parent).values_list("state", flat=True))
    assert counts == {JobState.CANCELLED: 498, JobState.TERMINATING: 2}
    # Running elements get the usual kill request; nothing new is placed.
    assert Task.objects.filter(job__array_parent=parent, kill_requested=True).count() == 2
    assert Task.objects.filter(job__array_parent=parent, state=TaskState.KILLED).count() == 498
    cancelled_events = Event.objects.filter(job=parent, reason="Cancelled")
    assert [e.message for e in cancelled_events] == ["498 elements cancelled: 2-499"]
    parent.refresh_from_db()
    assert parent.state == JobState.RUNNING  # not final while two elements still stop
    for index in (0, 1):
        agent_finishes(parent, index, TaskState.KILLED)
    run_scheduler_cycle()
    parent.refresh_from_db()
    assert parent.state == JobState.CANCELLED and parent.reason == "Cancelled"
    assert set(elements(parent).values_list("state", flat=True)) == {JobState.CANCELLED}
    # Every element counts as a cancelled job, those cancelled in bulk too; the parent is
    # not a job of its own in the count.
    assert _cancelled_count(staff) == 500


def test_one_failed_element_fails_the_array_once_all_have_finished(owner):
    make_node("big", cpu=64_000, memory=256 * 2**30)
    parent = submit_array(owner, "0-2")
    run_scheduler_cycle()
    agent_runs_assigned()
    agent_finishes(parent, 0)
    agent_finishes(parent, 1, TaskState.FAILED)
    run_scheduler_cycle()
    parent.refresh_from_db()
    assert parent.state == JobState.RUNNING
    agent_finishes(parent, 2)
    run_scheduler_cycle()
    run_scheduler_cycle()
    parent.refresh_from_db()
    assert (parent.state, parent.reason) == (JobState.FAILED, "ElementFailed")
    assert "1 failed, 2 succeeded" in parent.message


def test_a_resumed_element_cannot_break_the_limit(owner):
    make_node("big", cpu=64_000, memory=256 * 2**30)
    parent = submit_array(owner, "0-3%1")
    run_scheduler_cycle()
    agent_runs_assigned()
    held = elements(parent).get(array_index=3)
    held.requested_action = JobRequest.SUSPEND
    held.save()
    run_scheduler_cycle()  # suspended: the lifecycle clears its hold
    held.refresh_from_db()
    assert held.state == JobState.SUSPENDED and held.hold_reason == ""
    held.requested_action = JobRequest.RESUME
    held.save()
    for _ in range(3):
        run_scheduler_cycle()
        agent_runs_assigned()
        assert len(on_node(parent)) <= 1
    assert on_node(parent) == {0}


def test_elements_go_with_their_own_ttl_and_the_parent_after_the_last(owner):
    make_node("big", cpu=64_000, memory=256 * 2**30)
    parent = submit_array(owner, "0-1", ttl_seconds_after_finished=60)
    run_scheduler_cycle()
    agent_runs_assigned()
    agent_finishes(parent, 0)
    run_scheduler_cycle()
    later = timezone.now() + timedelta(seconds=120)
    assert lifecycle.cleanup_ttl(later) == 1  # element 0; element 1 and the parent stay
    assert list(elements(parent).values_list("array_index", flat=True)) == [1]
    agent_finishes(parent, 1)
    run_scheduler_cycle()
    run_scheduler_cycle()
    parent.refresh_from_db()
    assert parent.state == JobState.SUCCEEDED
    assert parent.array_counts["states"] == {"Succeeded": 1}
    lifecycle.cleanup_ttl(timezone.now() + timedelta(seconds=120))
    assert not Job.objects.exists()


def test_each_elements_tasks_start_with_its_index(owner, settings):
    settings.BERTH_JOIN_TOKEN = "join-secret"
    node = {"name": "n1", "cpu": "16", "memory": "64Gi", "devices": []}
    token = register(node, token="join-secret").json()["token"]
    parent = submit_array(owner, "3,5,7", replicas=2)
    plain = submit_job(owner, {"name": "plain", "tasks": [{"command": "true"}]})
    run_scheduler_cycle()
    starts = beat(token).json()["start"]
    by_job: dict[int, set[tuple[str, ...]]] = {}
    for start in starts:
        env = start["env"]
        keys = ("BERTH_ARRAY_JOB_ID", "BERTH_ARRAY_INDEX", "BERTH_ARRAY_TASK_COUNT")
        by_job.setdefault(start["job_id"], set()).add(tuple(env.get(k, "-") for k in keys))
    index = dict(elements(parent).values_list("pk", "array_index"))
    p = str(parent.pk)
    assert {index.get(j, "plain"): envs for j, envs in by_job.items()} == {
        3: {(p, "3", "3")}, 5: {(p, "5", "3")}, 7: {(p, "7", "3")}, "plain": {("-", "-", "-")},
    }  # fmt: skip
    assert plain.pk in by_job and len(starts) == 7


@pytest.mark.postgres
def test_the_set_based_insert_writes_the_same_rows_as_bulk_create(owner):
    from scheduler.jobs.arrays import create_elements

    def rows(parent: Job) -> list[dict[str, Any]]:
        drop = {"id", "array_parent_id", "created_at", "job_id"}
        jobs = [
            {k: v for k, v in job.items() if k not in drop}
            for job in elements(parent).values()
        ]  # fmt: skip
        tasks = [
            {k: v for k, v in task.items() if k not in drop}
            for task in Task.objects.filter(job__array_parent=parent)
            .order_by("job__array_index", "group", "index").values()
        ]  # fmt: skip
        return jobs + tasks

    made = []
    for set_based in (True, False):
        parent = submit_array(owner, "0")  # a parent to hang the elements on
        Job.objects.filter(array_parent=parent).delete()
        template = Job(
            name="sweep", owner=owner, queue=parent.queue, spec={"x": [1]}, labels={"a": "b"},
            walltime=5, priority=3, array_parent=parent,
        )  # fmt: skip
        groups = [
            ("main", 2, 1000, 2**30, {"gpu": 1, "gpu_share": 250, "gpu_memory": 2**30}),
            ("side", 1, 500, 2**20, {"gpu": 0}),
        ]
        create_elements(template, (4, 2, 9), 2, groups, set_based=set_based)
        made.append(rows(parent))
    assert made[0] == made[1]
    assert [(r.get("array_index"), r.get("hold_reason")) for r in made[0][:3]] == [
        (2, ""), (4, ""), (9, "array limit: 2/2 active"),
    ]  # fmt: skip
