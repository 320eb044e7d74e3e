"""Usage accounting: records written where task attempts end (agent reports, lost nodes),
summed by /api/v1/usage/, surviving TTL deletion of the jobs."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler import lifecycle
from scheduler.models import FinishedJobCount, Job, Node, Task, UsageRecord
from scheduler.states.names import JobState, TaskState
from tests.agentapi.test_protocol import agent, register
from tests.factories import make_job, make_node, make_usage, place

pytestmark = pytest.mark.django_db
JOIN = "join-secret"


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


def _agent(name: str = "gpu-01", gpus: int = 2) -> APIClient:
    body = {"name": name, "cpu": "16", "memory": "64Gi",
            "devices": [{"index": i, "uuid": f"{name}-{i}"} for i in range(gpus)]}  # fmt: skip
    token = register(body, token=JOIN).json()["token"]
    return agent(token)


def _beat(node: APIClient, reports: list[dict]) -> None:
    """A full-state report (an ended task says how much output it made)."""
    reports = [r if r["state"] == "Running" else {"output_bytes": 0, **r} for r in reports]
    response = node.post("/api/v1/agent/report/", {"tasks": reports}, format="json")
    assert response.status_code == 200, response.content


def _run_and_end(node, job: Job, ran_seconds: float, state: str = "Succeeded") -> list[Task]:
    """The agent starts the job's tasks, they run `ran_seconds`, then end in `state`."""
    tasks = list(job.tasks.all())
    _beat(node, [{"id": t.pk, "attempt": t.attempt, "state": "Running"} for t in tasks])
    # Move the start back instead of waiting.
    Task.objects.filter(job=job).update(started_at=timezone.now() - timedelta(seconds=ran_seconds))
    code = 0 if state == "Succeeded" else 1
    _beat(node, [{"id": t.pk, "attempt": t.attempt, "state": state, "exit_code": code}
                  for t in tasks])  # fmt: skip
    return list(job.tasks.all())


def _measured(tasks: list[Task]) -> float:
    total = 0.0
    for t in tasks:
        assert t.finished_at is not None and t.started_at is not None
        total += (t.finished_at - t.started_at).total_seconds()
    return total


def test_records_equal_the_tasks_measured_durations_and_survive_ttl(api, owner):
    agent = _agent()
    node = Node.objects.get()
    job = make_job(owner, "train", replicas=2, cpu=2500, gpu=1, ttl_seconds_after_finished=0)
    place(job, node, state=TaskState.ASSIGNED, devices=1)
    tasks = _run_and_end(agent, job, ran_seconds=100)
    wall = _measured(tasks)
    assert wall == pytest.approx(200, abs=5)
    records = list(UsageRecord.objects.order_by("task_id"))
    assert [(r.task_id, r.job_id, r.username, r.queue, r.state) for r in records] == [
        (t.pk, job.pk, "alice", "default", "Succeeded") for t in tasks]  # fmt: skip
    assert sum(r.wall_seconds for r in records) == pytest.approx(wall)
    assert sum(r.cpu_seconds for r in records) == pytest.approx(2.5 * wall)
    assert sum(r.gpu_seconds for r in records) == pytest.approx(1 * wall)

    lifecycle.sync_jobs()
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    assert list(FinishedJobCount.objects.values_list("queue", "state", "count")) == [
        ("default", "Succeeded", 1)]  # fmt: skip
    assert lifecycle.cleanup_ttl(timezone.now() + timedelta(seconds=1)) == 1
    assert not Job.objects.exists() and not Task.objects.exists()

    body = api(owner).get("/api/v1/usage/").json()
    assert body["group_by"] == ["user"]
    (row,) = body["results"]
    assert (row["user"], row["jobs"], row["tasks"]) == ("alice", 1, 2)
    assert row["wall_seconds"] == pytest.approx(wall, abs=0.01)
    assert row["cpu_seconds"] == pytest.approx(2.5 * wall, abs=0.01)
    assert row["gpu_hours"] == pytest.approx(wall / 3600, abs=0.001)


def test_a_re_sent_final_report_is_not_counted_twice(owner):
    agent = _agent()
    job = make_job(owner, gpu=1)
    place(job, Node.objects.get(), state=TaskState.ASSIGNED, devices=1)
    (task,) = _run_and_end(agent, job, ran_seconds=10)
    _beat(agent, [{"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0}])
    assert UsageRecord.objects.count() == 1


def test_a_task_that_ran_between_two_heartbeats_counts_from_its_binding(owner):
    agent = _agent()
    job = make_job(owner, gpu=1, cpu=2000)
    place(job, Node.objects.get(), state=TaskState.ASSIGNED, devices=1)
    Task.objects.update(assigned_at=timezone.now() - timedelta(seconds=30))
    (task,) = job.tasks.all()
    # Never reported Running: the first report the server sees is the end.
    _beat(agent, [{"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0}])
    task.refresh_from_db()
    assert task.started_at == task.finished_at
    (record,) = UsageRecord.objects.all()
    assert task.assigned_at is not None and task.finished_at is not None
    bound = (task.finished_at - task.assigned_at).total_seconds()
    assert record.wall_seconds == pytest.approx(bound) and bound >= 30
    assert record.started_at == task.assigned_at
    assert record.cpu_seconds == pytest.approx(2 * bound)


def test_tasks_lost_with_their_node_are_accounted_up_to_the_loss(owner, settings):
    node = make_node("gpu-02", gpus=1)
    job = make_job(owner, gpu=1, cpu=1000)
    place(job, node, devices=1)
    started = timezone.now() - timedelta(seconds=60)
    Task.objects.update(started_at=started)
    Node.objects.update(last_heartbeat=timezone.now() - timedelta(hours=1))
    assert lifecycle.check_nodes() == 1
    (record,) = UsageRecord.objects.all()
    task = Task.objects.get()
    assert record.state == "Lost"
    assert task.finished_at is not None
    assert record.wall_seconds == pytest.approx((task.finished_at - started).total_seconds())
    assert record.gpu_seconds == pytest.approx(record.wall_seconds)


def test_a_task_killed_before_it_started_uses_nothing(owner):
    job = make_job(owner)
    lifecycle.terminate_job(job, final_state=JobState.CANCELLED, reason="Cancelled", message="")
    assert not UsageRecord.objects.exists()
    assert FinishedJobCount.objects.get().state == "Cancelled"


def test_users_see_their_own_usage_and_staff_everyones(api, owner, teammate, staff):
    make_usage(owner, job_id=1)
    make_usage(owner, job_id=1)
    make_usage(teammate, queue="research", gpu_seconds=7200, job_id=2)
    mine = api(owner).get("/api/v1/usage/?group_by=user,queue").json()["results"]
    assert [(r["user"], r["queue"], r["jobs"], r["gpu_hours"]) for r in mine] == [
        ("alice", "default", 1, 2.0)]  # fmt: skip
    # A user asking for someone else's usage gets none of it.
    assert api(owner).get("/api/v1/usage/?user=bob").json()["results"] == []
    everyone = api(staff).get("/api/v1/usage/?group_by=user").json()["results"]
    assert [(r["user"], r["gpu_hours"]) for r in everyone] == [("alice", 2.0), ("bob", 2.0)]
    only_bob = api(staff).get("/api/v1/usage/?user=bob&group_by=queue").json()["results"]
    assert [(r["queue"], r["tasks"]) for r in only_bob] == [("research", 1)]
    assert api(None).get("/api/v1/usage/").status_code in (401, 403)


def test_it_groups_by_day_within_since_and_until(api, owner):
    make_usage(owner, days_ago=0)
    make_usage(owner, days_ago=2)
    make_usage(owner, days_ago=40)
    rows = api(owner).get("/api/v1/usage/?group_by=day").json()["results"]
    assert len(rows) == 2  # the default window is the last 30 days
    today = timezone.now().date()
    since = (today - timedelta(days=45)).isoformat()
    until = (today - timedelta(days=1)).isoformat()
    rows = api(owner).get(f"/api/v1/usage/?group_by=day&since={since}&until={until}").json()
    assert [r["day"] for r in rows["results"]] == [
        (timezone.now() - timedelta(days=40, minutes=1)).date().isoformat(),
        (timezone.now() - timedelta(days=2, minutes=1)).date().isoformat(),
    ]


def test_it_answers_csv(api, owner):
    make_usage(owner)
    response = api(owner).get("/api/v1/usage/?format=csv&group_by=user,queue")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["user", "queue", "jobs", "tasks", "cpu_seconds", "gpu_seconds",
                       "wall_seconds", "gpu_hours", "used_cpu_seconds", "cpu_percent",
                       "memory_percent", "gpu_percent"]  # fmt: skip
    assert rows[1][:4] == ["alice", "default", "1", "1"] and rows[1][7] == "1.0"
    assert rows[1][8:] == ["", "", "", ""]  # not measured: empty, not 0


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=yesterday", "since"),
        ("until=2026-13-45", "until"),
        ("group_by=node", "group_by"),
        ("group_by=user,user", "group_by"),
        ("since=2026-02-01&until=2026-01-01", "since"),
        ("since=2020-01-01&until=2026-01-01", "since"),
        ("format=xml", "format"),
        ("until=9999-12-31", "until"),
        ("since=0001-01-01", "since"),
        ("since=2026-11-01T00:00:00%2B99:00", "since"),
        ("since=" + "1" * 500, "since"),
        ("format=csv&group_by=x", "group_by"),
    ],
)
def test_bad_parameters_are_named(api, owner, query, field):
    response = api(owner).get(f"/api/v1/usage/?{query}")
    assert response.status_code == 400
    assert field in response.json()


@pytest.mark.parametrize("method", ["options", "post", "delete"])
def test_other_methods_answer_json_even_when_csv_is_asked(method, api, owner):
    response = getattr(api(owner), method)("/api/v1/usage/?format=csv")
    assert response.status_code in (200, 405)
    assert response["Content-Type"].startswith("application/json")


def test_metrics_count_each_users_usage_and_keep_it_past_ttl(owner, staff):
    from prometheus_client.parser import text_string_to_metric_families

    agent = _agent()
    job = make_job(owner, "train", replicas=2, cpu=2500, gpu=1, ttl_seconds_after_finished=0)
    place(job, Node.objects.get(), state=TaskState.ASSIGNED, devices=1)
    wall = _measured(_run_and_end(agent, job, ran_seconds=100))
    lifecycle.sync_jobs()
    assert lifecycle.cleanup_ttl(timezone.now() + timedelta(seconds=1)) == 1

    browser = Client()
    browser.force_login(staff)
    text = browser.get("/metrics").content.decode()
    samples = {
        (s.name, s.labels.get("user"), s.labels.get("queue")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    gpu = samples[("berth_usage_gpu_seconds_total", "alice", "default")]
    cpu = samples[("berth_usage_cpu_seconds_total", "alice", "default")]
    assert gpu == pytest.approx(wall) and cpu == pytest.approx(2.5 * wall)
