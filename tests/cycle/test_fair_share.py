"""Fair share, job priority factors and per-user limits through the database, the scheduler
loop and REST (docs/planning.md)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from scheduler.cycle import fairshare
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.intake.specs import SpecError
from scheduler.jobs.submit import submit_job
from scheduler.models import Job, Queue, Task, UserShare
from scheduler.states.names import JobState, TaskState
from tests.factories import make_node, make_usage

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_fair_share")]


def one_gpu_job(name: str = "j", **fields: Any) -> dict[str, Any]:
    return {"name": name, "tasks": [{"command": "true", "resources": {"gpu": 1}}], **fields}


def bound(job: Job) -> bool:
    return Task.objects.filter(job__in=[job], state=TaskState.ASSIGNED).exists()


def test_the_light_users_job_takes_the_first_free_gpu_ahead_of_2000_pending(owner, teammate):
    """alice used GPUs yesterday and queued 2,000 jobs; bob's one job, submitted after
    them all, starts on the first free GPU."""
    make_node("gpu-1", gpus=1, cpu=8000)
    make_usage(owner, gpu_seconds=8 * 3600.0, days_ago=1)
    heavy = submit_job(owner, one_gpu_job("sweep", array="0-1999"))
    light = submit_job(teammate, one_gpu_job("mine"))
    run_scheduler_cycle()
    assert bound(light)
    assert not Task.objects.filter(job__array_parent=heavy, state=TaskState.ASSIGNED).exists()
    first = Job.objects.filter(array_parent=heavy).order_by("id").first()
    assert first is not None and first.priority_factors is not None
    assert first.priority_factors["factors"]["fair_share"] < 0.5


def test_with_the_factors_off_the_first_submitted_goes_first(owner, teammate, settings):
    settings.BERTH_PRIORITY_FACTORS = False
    make_node("gpu-1", gpus=1, cpu=8000)
    make_usage(owner, gpu_seconds=8 * 3600.0, days_ago=1)
    heavy = submit_job(owner, one_gpu_job("sweep", array="0-9"))
    light = submit_job(teammate, one_gpu_job("mine"))
    run_scheduler_cycle()
    assert not bound(light)
    assert Task.objects.filter(job__array_parent=heavy, state=TaskState.ASSIGNED).count() == 1
    assert Job.objects.filter(priority_factors__isnull=False).count() == 0


def test_a_bigger_share_set_by_staff_puts_the_heavy_user_first(owner, teammate):
    make_node("gpu-1", gpus=1, cpu=8000)
    make_usage(owner, gpu_seconds=3600.0, days_ago=1)
    make_usage(teammate, gpu_seconds=1200.0, days_ago=1)
    UserShare.objects.create(user=owner, shares=10)
    heavy = submit_job(owner, one_gpu_job("a"))
    light = submit_job(teammate, one_gpu_job("b"))
    run_scheduler_cycle()
    assert bound(heavy) and not bound(light)


def test_usage_decays_with_the_half_life(owner, teammate, settings):
    """Long ago heavy: 100 GPU-hours eight half-lives ago count for less than one today;
    past ten half-lives they are not read at all."""
    settings.BERTH_FAIRSHARE_HALF_LIFE = 86400.0
    make_usage(owner, gpu_seconds=100 * 3600.0, days_ago=8)
    make_usage(owner, gpu_seconds=1000 * 3600.0, days_ago=20)
    make_usage(teammate, gpu_seconds=3600.0, days_ago=0)
    usage = fairshare.recorded_usage(timezone.now())
    assert usage[str(owner.pk)] < usage[str(teammate.pk)]


# --- per-user limits ---------------------------------------------------------------------


def limited(**limits: Any) -> Queue:
    queue = Queue.objects.get_or_create(name="default")[0]
    for key, value in limits.items():
        setattr(queue, key, value)
    queue.save()
    return queue


def test_a_job_past_a_running_limit_waits_with_user_limit(owner, teammate):
    limited(max_user_running_gpus=1)
    make_node("gpu-1", gpus=4, cpu=8000)
    first = submit_job(owner, one_gpu_job("a"))
    second = submit_job(owner, one_gpu_job("b"))
    other = submit_job(teammate, one_gpu_job("c"))
    run_scheduler_cycle()
    second.refresh_from_db()
    assert bound(first) and bound(other) and not bound(second)
    assert second.pending_code == "UserLimit"
    assert "running GPUs 1/1" in second.pending_message


def test_staff_are_exempt_where_the_queue_says_so(staff):
    limited(max_user_running_jobs=1, user_limits_exempt_staff=True)
    make_node("gpu-1", gpus=4, cpu=8000)
    jobs = [submit_job(staff, one_gpu_job(f"s{i}")) for i in range(3)]
    run_scheduler_cycle()
    assert all(bound(j) for j in jobs)


def test_a_submission_past_the_pending_limit_is_a_400_naming_it(api, owner, teammate):
    limited(max_user_pending_jobs=3)
    client = api(owner)
    for i in range(3):
        assert client.post("/api/v1/jobs/", one_gpu_job(f"j{i}"), format="json").status_code == 201
    response = client.post("/api/v1/jobs/", one_gpu_job("over"), format="json")
    assert response.status_code == 400, response.content
    assert "max_user_pending_jobs" in response.json()["queue"][0]
    assert "you have 3 pending" in response.json()["queue"][0]
    assert Job.objects.filter(owner=owner).count() == 3
    # Someone else's jobs are theirs to count.
    assert api(teammate).post("/api/v1/jobs/", one_gpu_job("b"), format="json").status_code == 201


def test_an_array_counts_by_its_elements(api, owner):
    limited(max_user_pending_jobs=5)
    client = api(owner)
    assert (
        client.post("/api/v1/jobs/", one_gpu_job("a", array="0-3"), format="json").status_code
        == 201
    )
    response = client.post("/api/v1/jobs/", one_gpu_job("b", array="0-1"), format="json")
    assert response.status_code == 400
    assert "adds 2" in response.json()["queue"][0]
    assert Job.objects.filter(owner=owner, array_parent__isnull=False).count() == 4
    assert client.post("/api/v1/jobs/", one_gpu_job("c"), format="json").status_code == 201


def test_a_staff_user_is_held_to_the_pending_limit_unless_exempt(api, staff):
    queue = limited(max_user_pending_jobs=1)
    client = api(staff)
    assert client.post("/api/v1/jobs/", one_gpu_job("a"), format="json").status_code == 201
    assert client.post("/api/v1/jobs/", one_gpu_job("b"), format="json").status_code == 400
    queue.user_limits_exempt_staff = True
    queue.save()
    assert client.post("/api/v1/jobs/", one_gpu_job("b"), format="json").status_code == 201


@pytest.mark.django_db(transaction=True)
def test_racing_submissions_cannot_both_pass_the_pending_limit(owner):
    Queue.objects.get_or_create(name="default")
    limited(max_user_pending_jobs=1)
    results: list[str] = []
    start = threading.Barrier(4)

    def submit(i: int) -> None:
        start.wait()
        try:
            submit_job(owner, one_gpu_job(f"r{i}"))
            results.append("ok")
        except SpecError:
            results.append("refused")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ok", "refused", "refused", "refused"]
    assert Job.objects.filter(owner=owner, state=JobState.PENDING).count() == 1


# --- REST for staff and users ------------------------------------------------------------


def test_staff_set_queue_limits_and_others_may_not(api, staff, owner):
    Queue.objects.get_or_create(name="default")
    body = {"max_user_running_gpus": 4, "max_user_running_cpus": "16",
            "max_user_pending_jobs": 100, "user_limits_exempt_staff": True}  # fmt: skip
    assert api(owner).patch("/api/v1/queues/default/", body, format="json").status_code == 403
    response = api(staff).patch("/api/v1/queues/default/", body, format="json")
    assert response.status_code == 200, response.content
    queue = Queue.objects.get(name="default")
    assert (queue.max_user_running_gpus, queue.max_user_running_cpus) == (4, 16000)
    bad = api(staff).patch("/api/v1/queues/default/", {"max_user_pending_jobs": -1}, format="json")
    assert bad.status_code == 400 and "max_user_pending_jobs" in bad.json()


def test_staff_set_shares_and_users_read_only_their_own(api, staff, owner, teammate):
    created = api(staff).post("/api/v1/shares/", {"user": "alice", "shares": 3}, format="json")
    assert created.status_code == 201, created.content
    api(staff).post("/api/v1/shares/", {"user": "bob", "shares": 1}, format="json")
    assert (
        api(owner)
        .post("/api/v1/shares/", {"user": "alice", "shares": 9}, format="json")
        .status_code
        == 403
    )
    mine = api(owner).get("/api/v1/shares/").json()
    assert [r["user"] for r in mine["results"]] == ["alice"]
    again = api(staff).post("/api/v1/shares/", {"user": "alice", "shares": 2}, format="json")
    assert again.status_code == 400 and "user" in again.json()
    bad = api(staff).post("/api/v1/shares/", {"user": "bob", "shares": -1}, format="json")
    assert bad.status_code == 400 and "shares" in bad.json()


def test_usage_shares_shows_usage_share_and_factor(api, staff, owner, teammate):
    make_usage(owner, gpu_seconds=3600.0)
    submit_job(teammate, one_gpu_job("b"))
    rows = api(staff).get("/api/v1/usage/shares/").json()["results"]
    by_user = {r["user"]: r for r in rows}
    assert by_user["bob"]["fair_share"] == 1.0
    assert by_user["alice"]["fair_share"] == pytest.approx(0.25)
    assert by_user["alice"]["norm_usage"] == 1.0
    own = api(owner).get("/api/v1/usage/shares/").json()["results"]
    assert [r["user"] for r in own] == ["alice"]


def test_the_api_shows_a_pending_jobs_factors(api, owner):
    make_node("gpu-1", gpus=0, cpu=8000)  # no GPU: it waits
    make_node("gpu-2", gpus=1, cpu=8000)
    job = submit_job(owner, one_gpu_job("a", array="0-1"))
    run_scheduler_cycle()
    waiting = Job.objects.filter(array_parent=job, tasks__state=TaskState.PENDING).first()
    assert waiting is not None
    body = api(owner).get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert set(body["priority_factors"]) == {"priority", "factors", "weighted"}
    assert body["priority_factors"]["factors"]["fair_share"] == 1.0


def test_factors_are_written_once_not_every_cycle(owner):
    make_node("gpu-1", gpus=1, cpu=8000)
    submit_job(owner, one_gpu_job("sweep", array="0-99"))
    first = run_scheduler_cycle()
    assert first.counts["factors_written"] == 99  # one placed, 99 wait
    # The placed one now counts as usage: the factors change once, then stand.
    assert run_scheduler_cycle().counts["factors_written"] == 99
    assert run_scheduler_cycle().counts["factors_written"] == 0
