"""The submit path stays lean: a submission answers from what it wrote (the same as a read),
signs in with one query whatever the token, and takes a bounded number of SQL statements."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from scheduler.intake.specs import SpecError
from scheduler.models import Event, Job, Queue, Task
from scheduler.ops.tokens import create_token
from tests.factories import GI, make_node

pytestmark = pytest.mark.django_db

SPEC = {
    "name": "lean",
    "tasks": [
        {"name": "main", "replicas": 3, "command": "true",
         "resources": {"cpu": "0.5", "memory": "1Gi", "gpu": 1}, "env": {"A": "1"}},
        {"name": "side", "command": "sleep 1", "resources": {"cpu": 1, "memory": "1Gi"}},
    ],
}  # fmt: skip

# Sign-in 1, queue 1, registered nodes' capacities for the never-fits check 1 (none here: a
# cluster without nodes is read every time), and job + tasks + event in one INSERT, without a
# transaction block (scheduler/sql.py, write_job). The live push runs after it and is not counted.
MAX_SUBMIT_STATEMENTS = 4


def client_with(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture(params=["drf", "self-service"])
def key(request: pytest.FixtureRequest, owner) -> str:
    if request.param == "drf":
        return str(Token.objects.create(user=owner).key)
    return create_token(owner, "laptop")[1]


def test_the_answer_to_a_submission_is_what_a_read_shows(key):
    client = client_with(key)
    created = client.post("/api/v1/jobs/", SPEC, format="json")
    assert created.status_code == 201, created.content
    read = client.get(f"/api/v1/jobs/{created.json()['id']}/")
    assert read.status_code == 200
    assert created.json() == read.json()
    assert [t["group"] for t in created.json()["tasks"]] == ["main"] * 3 + ["side"]
    assert Job.objects.get(pk=created.json()["id"]).tasks.count() == 4


def test_a_submission_takes_a_bounded_number_of_statements(
    key, django_assert_max_num_queries
):  # fmt: skip
    client = client_with(key)
    assert client.post("/api/v1/jobs/", SPEC, format="json").status_code == 201  # warm
    with django_assert_max_num_queries(MAX_SUBMIT_STATEMENTS):
        response = client.post("/api/v1/jobs/", SPEC, format="json")
    assert response.status_code == 201, response.content


def test_with_nodes_registered_a_submission_takes_three_statements(
    key, django_assert_num_queries
):  # fmt: skip
    """Sign-in, queue, insert: the nodes' capacities read by the first submission serve the
    never-fits check of the next ones for a second (acceptances only)."""
    make_node("gpu-a", gpus=4, cpu=32000, memory=256 * GI)
    client = client_with(key)
    assert client.post("/api/v1/jobs/", SPEC, format="json").status_code == 201
    with django_assert_num_queries(3):
        response = client.post("/api/v1/jobs/", SPEC, format="json")
    assert response.status_code == 201, response.content


def test_a_job_only_a_node_registered_since_can_run_is_accepted(owner):
    """The capacities remembered for acceptances never refuse: a refusal reads them again."""
    from scheduler.jobs.submit import submit_job

    def one_task(gpu: int) -> dict[str, Any]:
        return {"name": "one", "tasks": [{"name": "main", "command": "true",
                                          "resources": {"gpu": gpu}}]}  # fmt: skip

    make_node("small", gpus=1, cpu=32000, memory=256 * GI)
    submit_job(owner, one_task(1))  # reads and remembers: one node of one GPU
    big = one_task(8)
    with pytest.raises(SpecError):
        submit_job(owner, big)
    make_node("big", gpus=8, cpu=32000, memory=256 * GI)
    assert submit_job(owner, big).tasks.get().gpu == 8


def test_the_single_insert_writes_what_the_orm_writes(owner, monkeypatch):
    """PostgreSQL's one-statement insert and the ORM's path (SQLite) write the same rows:
    job, tasks, the submission's event and a lowered priority's event."""
    from django.db import connections

    from scheduler.jobs.submit import submit_job

    Queue.objects.filter(name="default").update(max_user_priority=10)
    spec = {**SPEC, "priority": 50, "labels": {"team": "x"}}

    def rows(job: Job) -> tuple[Any, ...]:
        fields = {f.attname for f in Job._meta.concrete_fields} - {"id", "created_at"}
        return (
            {name: getattr(Job.objects.get(pk=job.pk), name) for name in fields},
            list(job.tasks.order_by("group", "index")
                 .values_list("group", "index", "cpu", "memory", "gpu", "state", "attempt")),
            list(Event.objects.filter(job=job).order_by("id")
                 .values_list("kind", "reason", "message", "flow_id", "node_id")),
        )  # fmt: skip

    fast = submit_job(owner, spec, lower_priority_to_cap=True)
    monkeypatch.setattr(connections["default"], "vendor", "other")  # the ORM's path
    slow = submit_job(owner, spec, lower_priority_to_cap=True)
    monkeypatch.undo()
    assert rows(fast) == rows(slow)
    assert fast.priority == 10 and len(rows(fast)[2]) == 2
    assert [t.pk for t in fast.tasks.all()] == list(
        Task.objects.filter(job=fast).order_by("group", "index").values_list("pk", flat=True)
    )


def test_a_submitted_jobs_tasks_answer_like_any_related_rows(owner):
    from scheduler.jobs.submit import submit_job

    job = submit_job(owner, SPEC)
    assert [t.group for t in job.tasks.all()] == ["main"] * 3 + ["side"]
    assert job.tasks.filter(group="main").count() == 3  # a filter still asks the database
    assert job.tasks.exclude(group="main").get().allocations.exists() is False


def test_signing_in_takes_one_query_whatever_the_token(key, django_assert_num_queries):
    client = client_with(key)
    client.get("/api/v1/me/")  # a self-service token notes its first use once
    with django_assert_num_queries(1):
        assert client.get("/api/v1/me/").status_code == 200


def test_an_unknown_key_of_either_kind_is_refused():
    for key in ("berth_not-a-key", "0" * 40):
        assert client_with(key).get("/api/v1/me/").status_code == 401


@pytest.mark.parametrize(("path", "body"), [
    ("/api/v1/jobs/", {"name": "arr", "array": "0-3",
                       "tasks": [{"name": "main", "command": "true"}]}),
    ("/api/v1/flows/", {"name": "fl", "steps": [
        {"name": "one", "spec": {"tasks": [{"name": "main", "command": "true"}]}}]}),
])  # fmt: skip
def test_a_submission_that_committed_is_201_even_if_its_answer_cannot_be_read(
    owner, monkeypatch, path, body
):  # fmt: skip
    """An array's or a flow's answer is read back after its commit: a database gone by then
    must not make it a 503 (the client would submit it again)."""
    import psycopg
    from django.db import utils as db_utils
    from django.db.models import QuerySet

    real_get = QuerySet.get

    def gone(self: QuerySet[Any], *args: Any, **kwargs: Any) -> Any:
        if self.model.__name__ in ("Job", "Flow"):
            outer = db_utils.OperationalError("server closed the connection unexpectedly")
            outer.__cause__ = psycopg.OperationalError("server closed the connection")
            raise outer
        return real_get(self, *args, **kwargs)

    client = client_with(str(Token.objects.create(user=owner).key))
    monkeypatch.setattr(QuerySet, "get", gone)
    response = client.post(path, body, format="json")
    monkeypatch.setattr(QuerySet, "get", real_get)
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["name"] == body["name"] and answer["url"] == f"{path}{answer['id']}/"
    assert client.get(answer["url"]).json()["name"] == body["name"]  # it was written


@pytest.mark.parametrize(("kind", "body"), [
    ("jobs", {"name": "again", "tasks": [{"name": "main", "command": "true"}]}),
    ("flows", {"name": "again", "steps": [
        {"name": "one", "spec": {"tasks": [{"name": "main", "command": "true"}]}}]}),
])  # fmt: skip
def test_a_resubmitted_copy_is_201_even_if_its_answer_cannot_be_read(
    owner, monkeypatch, kind, body
):  # fmt: skip
    """A resubmission's copy is written with its event in one transaction; a database gone
    before the copy is read back leaves a 201 naming it (the CLI resends 503s: a 503 here
    made a second copy)."""
    import psycopg
    from django.db import utils as db_utils
    from django.db.models import QuerySet

    from scheduler.api import flows as flow_views

    real_get = QuerySet.get
    made: dict[str, Any] = {}

    def gone(self: QuerySet[Any], *args: Any, **kwargs: Any) -> Any:
        if made and self.model.__name__ in ("Job", "Flow"):
            outer = db_utils.OperationalError("server closed the connection unexpectedly")
            outer.__cause__ = psycopg.OperationalError("server closed the connection")
            raise outer
        return real_get(self, *args, **kwargs)

    def copied(real: Any) -> Any:
        def copy(*args: Any) -> Any:
            made["copy"] = real(*args)
            return made["copy"]

        return copy

    client = client_with(str(Token.objects.create(user=owner).key))
    first = client.post(f"/api/v1/{kind}/", body, format="json").json()["id"]
    name = "resubmit_job" if kind == "jobs" else "resubmit_flow"
    monkeypatch.setattr(flow_views, name, copied(getattr(flow_views, name)))
    monkeypatch.setattr(QuerySet, "get", gone)
    response = client.post(f"/api/v1/{kind}/{first}/resubmit/", format="json")
    monkeypatch.setattr(QuerySet, "get", real_get)
    assert response.status_code == 201, response.content
    assert response.json()["id"] == made["copy"].pk != first
    kinds = Event.objects.filter(**{kind[:-1]: made["copy"]}).values_list("kind", flat=True)
    assert f"{kind[:-1].capitalize()}Resubmitted" in kinds
