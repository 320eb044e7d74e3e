"""GPU history over the API: a job's devices stay listed after it ends, and the history
endpoints of nodes and jobs (series, windows, `after`, ownership, bad parameters)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Device, DeviceSample, Job, Node
from scheduler.states.names import JobState, TaskState
from tests.agentapi.test_protocol import agent
from tests.factories import finish_task, make_job, make_node, place

pytestmark = pytest.mark.django_db
GI = 2**30


def _node_with_token(name: str = "gpu-01", gpus: int = 4) -> tuple[Node, str]:
    node = make_node(name, gpus=gpus)
    token = node.issue_token()
    node.save()
    return node, token


def test_a_finished_jobs_tasks_still_list_their_node_and_gpus(api: Any, owner: Any) -> None:
    node, token = _node_with_token()
    Device.objects.filter(node=node, index__in=[0, 1]).update(healthy=False)  # place on 2, 3
    job = make_job(owner, gpu=2)
    run_scheduler_cycle()  # the scheduler binds the task to two GPUs
    task = job.tasks.get()
    url = f"/api/v1/jobs/{job.pk}/"
    running = api(owner).get(url).json()["tasks"][0]
    assert (running["node"], running["devices"]) == ("gpu-01", [2, 3])
    # The agent runs it and reports its end; its devices are freed and the job ends.
    reports = agent(token)
    for state in ("Running", "Succeeded"):
        body = {"tasks": [{"id": task.pk, "attempt": 0, "state": state, "exit_code": 0,
                           "output_bytes": 0}]}  # fmt: skip
        assert reports.post("/api/v1/agent/report/", body, format="json").status_code == 200
    run_scheduler_cycle()
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    assert not Device.objects.filter(allocations__isnull=False).exists()
    ended = api(owner).get(url).json()["tasks"][0]
    assert (ended["state"], ended["node"], ended["devices"]) == ("Succeeded", "gpu-01", [2, 3])


# --- history endpoints ---------------------------------------------------------------------


def _samples(node: Node, index: int, points: list[tuple[datetime, int]]) -> None:
    device = Device.objects.get(node=node, index=index)
    DeviceSample.objects.bulk_create(
        DeviceSample(device=device, time=t, utilization=u, memory_used=u * GI) for t, u in points
    )


def _ago(seconds: float) -> datetime:
    return timezone.now() - timedelta(seconds=seconds)


def test_a_nodes_history_charts_each_gpu_over_the_last_hour(api: Any, owner: Any) -> None:
    node, _ = _node_with_token(gpus=2)
    _samples(node, 0, [(_ago(7200), 5), (_ago(1800), 40), (_ago(600), 60)])
    _samples(node, 1, [(_ago(600), 90)])
    answer = api(owner).get("/api/v1/nodes/gpu-01/gpu-history/").json()
    assert [s["label"] for s in answer["series"]] == ["gpu-01 GPU 0", "gpu-01 GPU 1"]
    assert len(answer["x"]) == 2  # two hours ago is outside the default window
    gpu0, gpu1 = answer["series"]
    assert gpu0["utilization"] == [40, 60] and gpu1["utilization"] == [None, 90]
    assert gpu0["memory_used"] == [40 * GI, 60 * GI]
    assert answer["live"] is True and answer["until"] == pytest.approx(_ago(600).timestamp(), 2)
    # A wider window reaches back further.
    wide = api(owner).get("/api/v1/nodes/gpu-01/gpu-history/?window=10000").json()
    assert wide["series"][0]["utilization"][0] == 5


def test_after_returns_only_newer_samples(api: Any, owner: Any) -> None:
    node, _ = _node_with_token(gpus=1)
    _samples(node, 0, [(_ago(300), 10), (_ago(200), 20)])
    url = "/api/v1/nodes/gpu-01/gpu-history/"
    first = api(owner).get(url).json()
    _samples(node, 0, [(_ago(5), 77)])
    newer = api(owner).get(url, {"after": first["until"]}).json()
    assert newer["series"][0]["utilization"] == [77] and len(newer["x"]) == 1
    again = api(owner).get(url, {"after": newer["until"]}).json()
    assert again["x"] == [] and again["series"][0]["utilization"] == []
    assert again["until"] == newer["until"]


def test_a_long_window_is_averaged_into_a_bounded_number_of_points(
    api: Any, owner: Any, settings: Any
) -> None:
    node, _ = _node_with_token(gpus=1)
    start = _ago(86000)
    _samples(node, 0, [(start + timedelta(seconds=10 * i), i % 2 * 100) for i in range(8000)])
    answer = api(owner).get("/api/v1/nodes/gpu-01/gpu-history/?window=86400").json()
    assert len(answer["x"]) <= 721 and answer["step"] == 120
    values = [v for v in answer["series"][0]["utilization"] if v is not None]
    assert all(40 <= v <= 60 for v in values[1:-1])  # 12 samples of 0 and 100 per bucket


@pytest.mark.parametrize(
    ("query", "field"),
    [("window=0", "window"), ("window=abc", "window"), ("window=1e9", "window"),
     ("window=nan", "window"), ("after=-1", "after"), ("after=x", "after")],
)  # fmt: skip
def test_bad_history_parameters_are_named(api: Any, owner: Any, query: str, field: str) -> None:
    _node_with_token(gpus=1)
    response = api(owner).get(f"/api/v1/nodes/gpu-01/gpu-history/?{query}")
    assert response.status_code == 400 and field in response.json()


def test_an_unknown_node_is_404_and_anonymous_callers_are_refused(api: Any, owner: Any) -> None:
    assert api(owner).get("/api/v1/nodes/nope/gpu-history/").status_code == 404
    _node_with_token()
    assert api(None).get("/api/v1/nodes/gpu-01/gpu-history/").status_code in (401, 403)


def _job_that_ran(owner: Any, node: Node, began: float, ended: float | None) -> Job:
    job = make_job(owner, gpu=1)
    place(job, node, devices=1)
    job.tasks.update(started_at=_ago(began), finished_at=_ago(ended) if ended else None)
    return job


def test_a_jobs_history_shows_its_gpu_only_while_the_job_had_it(api: Any, owner: Any) -> None:
    node, _ = _node_with_token(gpus=1)
    # Another job used GPU 0 before this one, and yet another after it.
    _samples(node, 0, [(_ago(900), 11), (_ago(500), 55), (_ago(400), 66), (_ago(100), 22)])
    job = _job_that_ran(owner, node, began=600, ended=300)
    finish_task(job.tasks.get(), TaskState.SUCCEEDED, exit_code=0)
    job.tasks.update(finished_at=_ago(300))
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    answer = api(owner).get(f"/api/v1/jobs/{job.pk}/gpu-history/").json()
    assert [s["label"] for s in answer["series"]] == ["gpu-01 GPU 0"]
    assert answer["series"][0]["utilization"] == [55, 66]
    assert answer["live"] is False  # the page stops polling


def test_a_running_jobs_history_is_live(api: Any, owner: Any, staff: Any) -> None:
    node, _ = _node_with_token(gpus=2)
    job = _job_that_ran(owner, node, began=120, ended=None)
    _samples(node, 0, [(_ago(60), 93)])
    _samples(node, 1, [(_ago(60), 0)])  # not this job's GPU
    for user in (owner, staff):
        answer = api(user).get(f"/api/v1/jobs/{job.pk}/gpu-history/").json()
        assert answer["live"] is True
        assert [(s["index"], s["utilization"]) for s in answer["series"]] == [(0, [93])]


def test_another_users_job_history_is_404(api: Any, owner: Any, outsider: Any) -> None:
    node, _ = _node_with_token(gpus=1)
    job = _job_that_ran(owner, node, began=120, ended=None)
    _samples(node, 0, [(_ago(60), 93)])
    assert api(outsider).get(f"/api/v1/jobs/{job.pk}/gpu-history/").status_code == 404
    assert api(outsider).get("/api/v1/jobs/999999/gpu-history/").status_code == 404


def test_a_job_without_gpus_has_an_empty_history(api: Any, owner: Any) -> None:
    node, _ = _node_with_token(gpus=1)
    job = make_job(owner)
    place(job, node)
    answer = api(owner).get(f"/api/v1/jobs/{job.pk}/gpu-history/").json()
    assert answer["series"] == [] and answer["x"] == []
