"""Protocol 3: fewer requests per task. A lease that lists a started task confirms its start
(no report of its own), and a final report carries short output inline (no log upload),
with the guarantees of protocol 2 kept: output before success, one report's order."""

from __future__ import annotations

import pytest

from scheduler.lifecycle import sync_jobs
from scheduler.models import Allocation, Event, Node, Task, TaskLog
from scheduler.states.names import JobState, TaskState
from tests.agentapi.test_protocol import (
    JOIN,
    NODE,
    _assigned,
    beat,
    lease,
    register,
    rows,
    upload,
)
from tests.factories import make_job, place

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


def running(task: Task, attempt: int = 0) -> dict[str, object]:
    return {"id": task.pk, "attempt": attempt, "state": "Running"}


def test_a_lease_that_lists_a_started_task_confirms_its_start(owner):
    token = register().json()["token"]
    job, task = _assigned(owner, Node.objects.get())
    assert [s["id"] for s in lease(token).json()["start"]] == [task.pk]
    answer = lease(token, [running(task)], wait=0).json()  # the next lease, as agents send
    assert answer["start"] == [] and answer["kill"] == []
    task.refresh_from_db()
    assert task.state == TaskState.RUNNING and task.started_at is not None
    assert Event.objects.filter(kind="TaskStarted", job=job).count() == 1
    sync_jobs()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    # Listed again: nothing more changes (no second event, same start time).
    before = rows()
    lease(token, [running(task)], wait=0)
    after = rows()
    assert (after["tasks"], after["events"]) == (before["tasks"], before["events"])


def test_a_lease_confirms_only_this_nodes_current_attempt_and_never_undoes_an_end(owner):
    token = register().json()["token"]
    register({**NODE, "name": "gpu-02"})
    other = Node.objects.get(name="gpu-02")
    _, elsewhere = _assigned(owner, other, name="elsewhere")
    _, here = _assigned(owner, Node.objects.get(name="gpu-01"), name="here")
    ended = make_job(owner, "ended")
    place(ended, Node.objects.get(name="gpu-01"), state=TaskState.SUCCEEDED)
    done = ended.tasks.get()
    lease(token, [running(elsewhere), running(here, attempt=1), running(done)], wait=0)
    states = dict(Task.objects.values_list("pk", "state"))
    assert states == {elsewhere.pk: TaskState.ASSIGNED, here.pk: TaskState.ASSIGNED,
                      done.pk: TaskState.SUCCEEDED}  # fmt: skip


def test_a_final_report_carries_short_output_inline_and_ends_the_task_at_once(owner, api):
    token = register().json()["token"]
    job, task = _assigned(owner, Node.objects.get())
    lease(token, [running(task)], wait=0)
    upload(token, task.pk, 0, "first\n")  # output shipped while it ran
    text = "second\nlast é\n"
    size = 6 + len(text.encode())
    done = {"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0,
            "output_bytes": size, "output": {"offset": 6, "data": text}}  # fmt: skip
    answer = beat(token, [done]).json()
    assert answer["awaiting_output"] == []
    task.refresh_from_db()
    assert task.state == TaskState.SUCCEEDED and not Allocation.objects.exists()
    logs = api(owner).get(f"/api/v1/jobs/{job.pk}/logs/").json()["tasks"][0]
    assert (logs["data"], logs["next_offset"]) == ("first\n" + text, size)
    # The same final report again (a retry): the output is not stored twice.
    assert beat(token, [done]).status_code == 200
    assert TaskLog.objects.count() == 2


def test_inline_output_short_of_what_the_task_made_keeps_it_running(owner):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    done = {"id": task.pk, "attempt": 0, "state": "Failed", "exit_code": 3,
            "output_bytes": 20, "output": {"offset": 10, "data": "tail\n"}}  # fmt: skip
    answer = beat(token, [done]).json()
    assert answer["awaiting_output"] == [{"id": task.pk, "attempt": 0, "have": 0, "want": 20}]
    task.refresh_from_db()
    assert task.state == TaskState.RUNNING  # ended on the agent, not here: output missing


@pytest.mark.parametrize(
    ("output", "field"),
    [
        ("text", "tasks.0.output"),
        ({"offset": -1, "data": "x"}, "tasks.0.output.offset"),
        ({"offset": 0, "data": 5}, "tasks.0.output.data"),
        ({"offset": 0, "data": "x" * (16 * 1024 + 1)}, "tasks.0.output.data"),
    ],
)
def test_bad_inline_output_is_refused_whole_naming_the_field(owner, output, field):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    before = rows()
    done = {"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0,
            "output_bytes": 1, "output": output}  # fmt: skip
    response = beat(token, [done])
    assert response.status_code == 400 and field in response.json()
    assert rows() == before


def test_registration_says_how_much_output_may_travel_inline():
    assert register().json()["inline_output_bytes"] == 16 * 1024
