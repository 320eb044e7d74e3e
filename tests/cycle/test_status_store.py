"""A waiting job's Status in the database, the API and the change notices: stored as code,
message and node reasons, written only when it changes, pushed when it does."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from scheduler import notify
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Job, Node
from scheduler.states.names import JobState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


@pytest.fixture
def cycle(django_capture_on_commit_callbacks) -> Iterator[Callable[[], set[int]]]:  # type: ignore[no-untyped-def]
    """Runs one scheduler cycle and returns the job ids of its change notices, as the
    dashboard's listener gets them after commit."""
    seen: set[int] = set()

    def listener(jobs: set[int], flows: set[int], nodes: set[int]) -> None:
        seen.update(jobs)

    def run() -> set[int]:
        seen.clear()
        with django_capture_on_commit_callbacks(execute=True):
            run_scheduler_cycle()
        return set(seen)

    notify.connect(listener)
    try:
        yield run
    finally:
        notify.disconnect(listener)


def test_it_stores_the_code_message_and_node_reasons(owner, api):
    make_node("small", gpus=1)
    job = make_job(owner, gpu=2)
    run_scheduler_cycle()
    job.refresh_from_db()
    assert job.pending_code == "NeverFits"
    assert job.pending_node_reasons == {"insufficient gpu": 1}
    body = api(owner).get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["status"] == {
        "code": "NeverFits",
        "message": "0/1 nodes fit: 1 insufficient gpu",
        "node_reasons": {"insufficient gpu": 1},
    }
    assert body["pending_reasons"] == ["0/1 nodes fit: 1 insufficient gpu"]
    listed = api(owner).get("/api/v1/jobs/").json()["results"][0]
    assert listed["status"]["code"] == "NeverFits"


def test_it_writes_and_pushes_a_status_only_when_it_changes(owner, cycle):
    node = make_node("a", gpus=1)
    busy = make_job(owner, "busy", gpu=1, preemptible=False)
    place(busy, node, devices=1)
    waiting = make_job(owner, "waiting", gpu=1)
    assert waiting.pk in cycle()
    first = Job.objects.get(pk=waiting.pk)
    assert first.pending_code == "Reserved"
    # The same status next cycle: no write (a row written is a row pushed), no push.
    assert waiting.pk not in cycle()
    assert Job.objects.get(pk=waiting.pk).pending_message == first.pending_message
    # A closed queue changes the code: written and pushed.
    waiting.queue.open = False
    waiting.queue.save()
    assert waiting.pk in cycle()
    waiting.refresh_from_db()
    assert waiting.pending_code == "QueueClosed"


def test_a_job_that_fit_says_never_fits_once_the_cluster_shrinks(owner, api, cycle):
    make_node("big", gpus=4)
    make_node("small", gpus=1)
    busy = make_job(owner, "busy", gpu=4, preemptible=False)
    place(busy, Node.objects.get(name="big"), devices=4)
    job = make_job(owner, "waiting", gpu=2)
    cycle()
    job.refresh_from_db()
    assert job.pending_code in ("Reserved", "WaitingForResources")

    Job.objects.filter(pk=busy.pk).delete()
    Node.objects.filter(name="big").delete()
    assert job.pk in cycle()
    status = api(owner).get(f"/api/v1/jobs/{job.pk}/").json()["status"]
    assert status["code"] == "NeverFits"
    assert status["node_reasons"] == {"insufficient gpu": 1}


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"hold_reason": "waiting for a parallelism slot (2/2 active in flow f)"}, "Held",
         "waiting for a parallelism slot (2/2 active in flow f)"),
        ({"hold_reason": "array limit: 2/2 active"}, "Held", "array limit: 2/2 active"),
        ({"state": JobState.SUSPENDED, "reason": "UserSuspended", "message": "suspended by alice"},
         "Held", "suspended by alice"),
    ],
)  # fmt: skip
def test_jobs_held_outside_the_core_say_so(owner, api, fields, code, message):
    job = make_job(owner, **fields)
    run_scheduler_cycle()
    status = api(owner).get(f"/api/v1/jobs/{job.pk}/").json()["status"]
    assert status == {"code": code, "message": message, "node_reasons": {}}


def test_a_running_job_has_no_status(owner, api):
    node = make_node("a", gpus=1)
    job = make_job(owner, gpu=1, pending_code="Reserved", pending_message="stale")
    place(job, node, devices=1)
    body = api(owner).get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["status"] is None and body["pending_reasons"] == []
