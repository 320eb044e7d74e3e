"""How an interactive job ends with its last terminal session (scheduler/jobs/terminals.py,
docs/interactive.md): as a batch job would by its command's exit status (0: Succeeded, else
Failed), Cancelled when the session ended by policy or its user went away, Failed when the
session itself failed; always with the reason `SessionEnded` and a message saying how, never
"cancelled by user". The job ends through its agent's report of the stopped task."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.jobs import terminals
from scheduler.models import Job, Node, Queue, ShellSession
from tests.agentapi.test_protocol import JOIN, agent, register
from tests.factories import place

pytestmark = pytest.mark.django_db
SHELL = {"name": "shell", "tasks": [{"name": "main", "command": "exec sleep infinity"}]}


@pytest.fixture
def token(settings: Any) -> str:
    settings.BERTH_JOIN_TOKEN = JOIN
    return str(register().json()["token"])


def open_shell(api: Any, owner: Any, persist: bool = False) -> tuple[Job, ShellSession]:
    spec = {**SHELL, "interactive": {"persist": persist}}
    response = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    place(job, Node.objects.get(name="gpu-01"))
    Job.objects.filter(pk=job.pk).update(state="Running", started_at=timezone.now())
    session = ShellSession.objects.create(
        key="k" * 48, job=job, task=job.tasks.get(), node=Node.objects.get(name="gpu-01"),
        user=owner, state=ShellSession.State.OPEN, opened_at=timezone.now(),
    )  # fmt: skip
    return job, session


def stopped(token: str, job: Job) -> Job:
    """The agent kills the task it was told to and reports it: the job ends."""
    task = job.tasks.get()
    running = {"id": task.pk, "attempt": 0, "state": "Running", "output_bytes": 0,
               "exit_code": None}  # fmt: skip
    body = {"tasks": [running], "wait": 0}
    lease = agent(token).post("/api/v1/agent/lease/", body, format="json")
    assert [k["id"] for k in lease.json()["kill"]] == [task.pk]
    report = {"id": task.pk, "attempt": 0, "state": "Killed", "output_bytes": 0,
              "exit_code": None}  # fmt: skip
    assert agent(token).post("/api/v1/agent/report/", {"tasks": [report]},
                             format="json").status_code == 200  # fmt: skip
    run_scheduler_cycle()
    return Job.objects.get(pk=job.pk)


@pytest.mark.parametrize(
    ("reason", "exit_status", "message", "state", "said"),
    [
        ("Exited", 0, "", "Succeeded", "(Exited, the command's exit status 0)"),
        ("Exited", 7, "", "Failed", "(Exited, the command's exit status 7)"),
        ("Idle", None, "no input for 30 minutes", "Cancelled", "(Idle: no input for 30"),
        ("Disconnected", None, "the user's socket closed", "Cancelled", "(Disconnected: the"),
        ("AgentGone", None, "the agent's socket closed", "Failed", "(AgentGone: the agent's"),
    ],
)
def test_the_job_ends_as_its_last_session_did(
    token: str, api: Any, owner: Any, reason: str, exit_status: int | None, message: str,
    state: str, said: str,
) -> None:  # fmt: skip
    job, session = open_shell(api, owner)
    assert terminals.close_session(session.key, reason, message, exit_status)
    ending = Job.objects.get(pk=job.pk)
    assert (ending.state, ending.reason, ending.terminal_state) == (
        "Terminating",
        "SessionEnded",
        state,
    )
    ended = stopped(token, job)
    assert (ended.state, ended.reason) == (state, "SessionEnded")
    assert said in ended.message and "cancelled by user" not in ended.message
    assert ended.requested_action == ""


def test_a_persisting_job_outlives_a_dropped_session_but_not_its_commands_exit(
    token: str, api: Any, owner: Any
) -> None:
    job, session = open_shell(api, owner, persist=True)
    assert terminals.close_session(session.key, "Disconnected", "the user's socket closed")
    assert Job.objects.get(pk=job.pk).state == "Running"
    again = ShellSession.objects.create(
        key="m" * 48, job=job, task=job.tasks.get(), node=session.node, user=owner,
        state=ShellSession.State.OPEN, opened_at=timezone.now(),
    )  # fmt: skip
    assert terminals.close_session(again.key, "Exited", "", 0)
    assert stopped(token, job).state == "Succeeded"


def test_a_job_already_being_cancelled_is_left_to_end_cancelled(
    token: str, api: Any, owner: Any
) -> None:
    job, session = open_shell(api, owner)
    assert api(owner).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code in (200, 202)
    run_scheduler_cycle()  # the cancel is carried out: Terminating, to end Cancelled
    assert terminals.close_session(session.key, "Exited", "", 0)
    ended = stopped(token, job)
    assert (ended.state, ended.message) == ("Cancelled", "cancelled by user")


def referable_when_ending(
    monkeypatch: Any, module: Any, rows: dict[str, tuple[str, int]]
) -> dict[str, bool]:
    """Whether each of `rows` is referable at the moment `module` calls `terminate_job`
    (its locks then held), filled in as it does."""
    seen: dict[str, bool] = {}
    real = module.terminate_job

    def terminate(*args: Any, **kwargs: Any) -> None:
        seen.update({name: referable(table, pk) for name, (table, pk) in rows.items()})
        real(*args, **kwargs)

    monkeypatch.setattr(module, "terminate_job", terminate)
    return seen


def referable(table: str, pk: int) -> bool:
    """Whether another transaction may reference row `pk` of `table` now, as a report's
    events and usage records do when it commits (FOR KEY SHARE), without waiting."""
    s = connection.settings_dict
    where = {"dbname": s["NAME"], "host": s["HOST"] or "127.0.0.1", "port": s["PORT"] or 5432,
             "user": s["USER"], "password": s["PASSWORD"] or None}  # fmt: skip
    with psycopg.connect(**where) as other:
        try:
            other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR KEY SHARE NOWAIT", [pk])
        except psycopg.errors.LockNotAvailable:
            return False
    return True


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_closing_session_leaves_its_owner_and_job_referable(
    token: str, api: Any, owner: Any, monkeypatch: Any
) -> None:
    """While a close ends the job (it then waits for the task's row, which a report of the
    node's tasks holds), the rows that report must reference to commit stay free: it locked
    the owner's and the job's FOR UPDATE, and 16 sessions ending at once deadlocked with the
    agent's report (PostgreSQL: a 500 to the agent, a session left open, its job running)."""
    Queue.objects.get_or_create(name="default")  # a flushed database has none
    job, session = open_shell(api, owner)
    rows = {"owner": (User._meta.db_table, owner.pk), "job": (Job._meta.db_table, job.pk)}
    seen = referable_when_ending(monkeypatch, terminals, rows)
    assert terminals.close_session(session.key, "Exited", "", 0)
    assert seen == {"owner": True, "job": True}
    assert Job.objects.get(pk=job.pk).terminal_state == "Succeeded"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_cancel_carried_out_leaves_the_job_referable(
    token: str, api: Any, owner: Any, monkeypatch: Any
) -> None:
    """The scheduler carrying out a user's cancel locks the job, then the job's tasks (which a
    report of the node's tasks may hold while it waits to reference the job): the job's lock
    must leave it referable (FOR NO KEY UPDATE), as the close's does, or the two deadlock."""
    from scheduler.lifecycle import requests

    Queue.objects.get_or_create(name="default")  # a flushed database has none
    job, _session = open_shell(api, owner)
    seen = referable_when_ending(monkeypatch, requests, {"job": (Job._meta.db_table, job.pk)})
    assert api(owner).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code in (200, 202)
    requests.process_requests()
    assert seen == {"job": True}
    assert Job.objects.get(pk=job.pk).terminal_state == "Cancelled"
