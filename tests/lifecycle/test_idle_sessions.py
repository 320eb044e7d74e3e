"""Idle interactive GPU sessions (scheduler/lifecycle/idle_sessions.py, issue #24): an
interactive job (`berth shell`'s spec `interactive`, or a web app) whose GPUs its agent's
leases report idle and whose terminals get no input for its queue's
`interactive_gpu_idle_minutes` is warned (an event, one notification through the outbox, the
job's `idle_ends_at` in the API and `berth show`), and ended by the scheduler loop's
housekeeping when still idle BERTH_IDLE_SESSION_GRACE_MINUTES later: the lease orders its
task killed and the job ends Cancelled with the reason `GpuIdleTimeout`. GPU use or terminal
input withdraws the warning; batch jobs are only flagged; other jobs are untouched.

Time passes by moving the rows' times back (`age`), as tests/agent/test_gpu_idle.py does."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from django.test import Client as DjangoClient
from django.utils import timezone

from berth.cli import main
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.lifecycle import idle_sessions
from scheduler.models import Event, Job, Node, Outbox, Queue, ShellSession, Task
from scheduler.ops import gpu_idle
from tests.agentapi.test_protocol import JOIN, agent, register
from tests.factories import make_job, place

pytestmark = pytest.mark.django_db
SHELL = {"name": "shell", "interactive": {"persist": False},
         "tasks": [{"name": "main", "command": "exec sleep infinity",
                    "resources": {"gpu": 1}}]}  # fmt: skip
IDLE_KINDS = ("SessionIdleWarning", "SessionIdleCleared")


@pytest.fixture
def token(settings: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    settings.BERTH_JOIN_TOKEN = JOIN
    settings.BERTH_GPU_IDLE_MINUTES = 30
    settings.BERTH_IDLE_SESSION_GRACE_MINUTES = 10
    # Every cycle runs the checks (the loop runs them at most every 10 s).
    monkeypatch.setattr(idle_sessions, "CHECK_SECONDS", 0.0)
    monkeypatch.setattr(gpu_idle, "CHECK_SECONDS", 0.0)
    return str(register().json()["token"])  # gpu-01 with GPUs 0 and 1


def submit(api: Any, user: Any, **spec: Any) -> Job:
    response = api(user).post("/api/v1/jobs/", {**SHELL, **spec}, format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    place(job, Node.objects.get(name="gpu-01"), devices=1)
    return job


def task_of(job: Job) -> Task:
    return job.tasks.get()


def lease(token: str, *utilisation: tuple[Job, float | None]) -> dict[str, Any]:
    """A lease renewal carrying each job's task's GPU utilisation."""
    items = [{"id": task_of(job).pk, "attempt": 0, "state": "Running", "output_bytes": 0,
              "exit_code": None, "gpu_utilization": value}
             for job, value in utilisation]  # fmt: skip
    body = {"tasks": items, "wait": 0}
    response = agent(token).post("/api/v1/agent/lease/", body, format="json")
    assert response.status_code == 200, response.json()
    return dict(response.json())


def age(minutes: float) -> None:
    """`minutes` pass: every time the rule reads moves back that much."""
    back = timedelta(minutes=minutes)

    def shift(rows: Any, *fields: str) -> None:
        for row in rows.values("pk", *fields):
            moved = {name: row[name] - back for name in fields if row[name] is not None}
            if moved:
                rows.filter(pk=row["pk"]).update(**moved)

    shift(Task.objects.all(), "gpu_idle_since", "started_at")
    shift(Job.objects.all(), "started_at", "idle_warned_at", "idle_ends_at", "app_used_at")
    shift(ShellSession.objects.all(), "opened_at", "last_input_at")


def cycle(times: int = 1) -> None:
    for _ in range(times):
        run_scheduler_cycle()


def idle_events(job: Job) -> list[tuple[str, str]]:
    rows = Event.objects.filter(job=job, kind__in=IDLE_KINDS).order_by("pk")
    return list(rows.values_list("kind", "reason"))


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def test_an_idle_gpu_session_is_warned_once_then_ended_with_its_own_code(
    token: str, api: Any, owner: Any
) -> None:
    owner.email = "alice@example.org"
    owner.save()
    job = submit(api, owner)
    lease(token, (job, 0.0))
    age(59)
    cycle()
    assert idle_events(job) == []  # the queue's limit (60 min) is not reached
    age(2)
    cycle(3)  # however many checks: one warning, one notification
    assert idle_events(job) == [("SessionIdleWarning", "GpusIdle")]
    warning = Event.objects.get(job=job, kind="SessionIdleWarning").message
    assert "no terminal input for 61 min" in warning and "queue default: 60 min" in warning
    sent = Outbox.objects.filter(job=job, kind="session_idle")
    assert list(sent.values_list("channel", "target")) == [("email", "alice@example.org")]
    assert "will be ended at" in sent.get().text
    shown = api(owner).get(f"/api/v1/jobs/{job.pk}/").json()
    assert shown["state"] == "Running" and shown["idle_ends_at"] is not None
    # Still idle within the grace: nothing more; past it, ended.
    age(9)
    cycle()
    assert fresh(job).state == "Running"
    age(2)
    cycle(2)
    ended = fresh(job)
    assert (ended.state, ended.reason) == ("Terminating", "GpuIdleTimeout")
    assert "no terminal input" in ended.message and ended.idle_ends_at is None
    # The agent is told to stop the task, and its report ends the job with that code.
    assert [k["id"] for k in lease(token, (job, 0.0))["kill"]] == [task_of(job).pk]
    report = {"id": task_of(job).pk, "attempt": 0, "state": "Killed", "output_bytes": 0,
              "exit_code": None}  # fmt: skip
    assert agent(token).post("/api/v1/agent/report/", {"tasks": [report]},
                             format="json").status_code == 200  # fmt: skip
    cycle(2)
    ended = fresh(job)
    assert (ended.state, ended.reason) == ("Cancelled", "GpuIdleTimeout")
    assert idle_events(job) == [("SessionIdleWarning", "GpusIdle")]
    assert Outbox.objects.filter(job=job, kind="session_idle").count() == 1


def test_gpu_use_withdraws_the_warning_and_a_new_stretch_starts_from_zero(
    token: str, api: Any, owner: Any
) -> None:
    job = submit(api, owner)
    lease(token, (job, 0.0))
    age(61)
    cycle()
    assert fresh(job).idle_warned_at is not None
    lease(token, (job, 42.0))  # busy again
    cycle(2)
    assert idle_events(job) == [("SessionIdleWarning", "GpusIdle"),
                                ("SessionIdleCleared", "GpusBusy")]  # fmt: skip
    assert fresh(job).idle_ends_at is None
    age(30)  # past the old warning's end: nothing happens
    cycle()
    assert fresh(job).state == "Running"
    # Idle again: the limit counts from the new stretch's start.
    lease(token, (job, 0.0))
    age(30)
    cycle()
    assert len(idle_events(job)) == 2
    age(31)
    cycle()
    assert [k for k, _ in idle_events(job)] == [
        "SessionIdleWarning",
        "SessionIdleCleared",
        "SessionIdleWarning",
    ]


def test_terminal_input_withdraws_the_warning(token: str, api: Any, owner: Any) -> None:
    """The session's input time, as its agent's socket writes it (mark_input; the socket
    itself is tested in tests/dashboard/test_idle_session_sockets.py)."""
    from scheduler.jobs import terminals

    job = submit(api, owner)
    session = ShellSession.objects.create(
        key="k" * 48, job=job, task=task_of(job), node=Node.objects.get(name="gpu-01"), user=owner,
        state=ShellSession.State.OPEN, opened_at=timezone.now(),
    )  # fmt: skip
    lease(token, (job, 0.0))
    age(61)
    cycle()
    assert fresh(job).idle_warned_at is not None
    terminals.mark_input(session.key)
    cycle()
    assert idle_events(job)[-1] == ("SessionIdleCleared", "TerminalInput")
    age(11)
    cycle()
    assert fresh(job).state == "Running"


def test_batch_jobs_are_flagged_never_ended_and_neighbours_untouched(
    token: str, api: Any, owner: Any, teammate: Any
) -> None:
    batch = make_job(owner, "train", gpu=1, command="python train.py")
    place(batch, Node.objects.get(name="gpu-01"), devices=1)
    busy = submit(api, teammate, name="busy-shell")
    no_gpu = make_job(owner, "cpu-shell", gpu=0, command="exec sleep infinity")
    Job.objects.filter(pk=no_gpu.pk).update(spec={**no_gpu.spec, "interactive": {"persist": False}})
    place(no_gpu, Node.objects.get(name="gpu-01"))
    lease(token, (batch, 0.0), (busy, 55.0))
    for _ in range(4):
        age(60)
        cycle()
    assert fresh(batch).gpu_idle_since is not None  # flagged, as before
    assert Event.objects.filter(job=batch, kind="JobGpuIdle").count() == 1
    for job in (batch, busy, no_gpu):
        assert fresh(job).state == "Running" and idle_events(job) == []
        assert fresh(job).idle_warned_at is None


def test_the_queues_limit_decides_and_zero_turns_it_off(
    token: str, api: Any, owner: Any, staff: Any
) -> None:
    changed = api(staff).patch("/api/v1/queues/default/", {"interactive_gpu_idle_minutes": 5},
                               format="json")  # fmt: skip
    assert changed.status_code == 200, changed.json()
    assert changed.json()["interactive_gpu_idle_minutes"] == 5
    job = submit(api, owner, apps="jupyter")  # a web app is an interactive session too
    lease(token, (job, 0.0))
    age(6)
    cycle()
    assert idle_events(job) == [("SessionIdleWarning", "GpusIdle")]
    Queue.objects.filter(name="default").update(interactive_gpu_idle_minutes=0)
    cycle()  # the warning goes without an event; the job is never ended
    assert fresh(job).idle_warned_at is None and len(idle_events(job)) == 1
    age(600)
    cycle()
    assert fresh(job).state == "Running"


def test_berth_show_and_the_job_page_say_when_a_warned_session_ends(
    token: str, api: Any, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = submit(api, owner)
    lease(token, (job, 0.0))
    age(61)
    cycle()

    class Client:  # the CLI's client, answered by the REST API as the job's owner
        def get(self, path: str, **params: Any) -> Any:
            return api(owner).get(f"/api/v1/{path}", params).json()

    monkeypatch.setattr(main, "client", Client)
    result = CliRunner().invoke(main.cli, ["show", str(job.pk)])
    assert result.exit_code == 0, result.output
    assert "ends at" in result.output and "no terminal input" in result.output
    # The job page too.
    page = DjangoClient()
    page.force_login(owner)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert f'id="job-{job.pk}-idle-warning"' in html and "will be ended at" in html


def test_the_use_of_its_app_withdraws_the_warning(
    token: str, api: Any, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook used through the proxy with its GPUs idle (a cell being written) is in use:
    the proxy writes the owner's use on the job (what counts as use, and how often it is
    written: tests/web/test_appproxy.py)."""
    from scheduler.jobs import webapps

    job = submit(api, owner, apps="jupyter")
    lease(token, (job, 0.0))
    age(61)
    cycle()
    warning = Event.objects.get(job=job, kind="SessionIdleWarning").message
    assert "no terminal input or app request for 61 min" in warning
    assert "unless its app or terminal is used" in warning
    webapps.mark_app_used(job.pk)  # the owner runs a cell
    cycle()
    assert idle_events(job)[-1] == ("SessionIdleCleared", "AppRequest")
    age(11)
    cycle()
    assert fresh(job).state == "Running"
    # Unused again from then on: warned anew, then ended.
    age(61)
    cycle()
    assert idle_events(job)[-1] == ("SessionIdleWarning", "GpusIdle")
    age(11)
    cycle()
    assert (fresh(job).state, fresh(job).reason) == ("Terminating", "GpuIdleTimeout")
