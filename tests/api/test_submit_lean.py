"""The submit path stays lean: a submission answers from what it wrote (the same as a read),
signs in with one query whatever the token, and takes a bounded number of SQL statements."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from scheduler.models import Job
from scheduler.tokens import create_token

pytestmark = pytest.mark.django_db

SPEC = {
    "name": "lean",
    "tasks": [
        {"name": "main", "replicas": 3, "command": "true",
         "resources": {"cpu": "0.5", "memory": "1Gi", "gpu": 1}, "env": {"A": "1"}},
        {"name": "side", "command": "sleep 1", "resources": {"cpu": 1, "memory": "1Gi"}},
    ],
}  # fmt: skip

# Sign-in 1, queue 1, registered nodes' capacities for the never-fits check 1, job + tasks
# (one insert for all of them) + event 3, and the transaction's two SAVEPOINT statements (a
# test runs inside a transaction; a request's own BEGIN/COMMIT otherwise). The live push runs
# after commit and is not counted here.
MAX_SUBMIT_STATEMENTS = 8


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


def test_a_submitted_jobs_tasks_answer_like_any_related_rows(owner):
    from scheduler.submit import submit_job

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
