"""List endpoints answer an unknown query parameter or a bad filter value with a 400 naming it
(never an unfiltered list), and still take every parameter the CLI and pages send."""

from __future__ import annotations

import pytest

from scheduler.jobs.submit import create_flow, submit_job
from scheduler.models import JobTemplate
from tests.factories import make_node

pytestmark = pytest.mark.django_db

LISTS = ["/api/v1/queues/", "/api/v1/nodes/", "/api/v1/templates/", "/api/v1/jobs/",
         "/api/v1/flows/", "/api/v1/events/", "/api/v1/tokens/", "/api/v1/usage/"]  # fmt: skip


@pytest.fixture
def cluster(owner):
    make_node("n1")
    JobTemplate.objects.create(name="t", spec={"tasks": [{"command": "true"}]})
    job = submit_job(owner, {"name": "j", "tasks": [{"command": "true"}]})
    flow = create_flow(owner, {"name": "f", "steps": [{"name": "a", "template": "t"}]})
    return job, flow


def _nested_lists(cluster):
    job, flow = cluster
    return [f"/api/v1/jobs/{job.pk}/events/", f"/api/v1/flows/{flow.pk}/events/"]


@pytest.mark.parametrize("url", LISTS)
@pytest.mark.parametrize("param", ["q", "limit", "offset", "State"])
def test_an_unknown_query_parameter_is_a_400_naming_it(api, owner, cluster, url, param):
    response = api(owner).get(url, {param: "x"})
    assert response.status_code == 400, (url, response.content)
    assert param in response.json(), response.json()
    assert "unknown query parameter" in response.json()[param][0]


def test_nested_lists_refuse_unknown_parameters_too(api, owner, cluster):
    for url in _nested_lists(cluster):
        response = api(owner).get(url, {"q": "x"})
        assert response.status_code == 400 and "q" in response.json(), url
        assert api(owner).get(url, {"page": 1, "page_size": 10}).status_code == 200


@pytest.mark.parametrize(
    ("url", "params", "name"),
    [
        ("/api/v1/jobs/", {"state": "running"}, "state"),  # wrong case
        ("/api/v1/jobs/", {"state": "Done"}, "state"),
        ("/api/v1/flows/", {"state": "finished"}, "state"),
        ("/api/v1/nodes/", {"state": "ready"}, "state"),
        ("/api/v1/jobs/", {"ordering": "colour"}, "ordering"),
        ("/api/v1/jobs/", {"ordering": "-id,nope"}, "ordering"),
        ("/api/v1/queues/", {"ordering": "password"}, "ordering"),
        ("/api/v1/jobs/", {"flat": "maybe"}, "flat"),
        ("/api/v1/jobs/", {"array": "x"}, "array"),
        ("/api/v1/jobs/", {"page_size": "lots"}, "page_size"),
        ("/api/v1/jobs/", {"page_size": "0"}, "page_size"),
        ("/api/v1/flows/", {"page": "first"}, "page"),
        ("/api/v1/events/", {"job": "x"}, "job"),
    ],
)
def test_a_bad_filter_value_is_a_400_naming_it(api, owner, cluster, url, params, name):
    response = api(owner).get(url, params)
    assert response.status_code == 400, response.content
    assert name in response.json(), response.json()


def test_a_wrong_case_state_says_which_states_exist(api, owner, cluster):
    message = api(owner).get("/api/v1/jobs/", {"state": "running"}).json()["state"][0]
    assert "'running' is not a job state" in message and "Running" in message


@pytest.mark.parametrize(
    ("url", "params"),
    [  # what `berth jobs`, `berth flows`, `berth nodes`, `berth usage` and the pages send
        ("/api/v1/jobs/", {"page": 1, "page_size": 500, "state": "Pending", "owner": "alice",
                           "queue": "default", "ordering": "-id"}),
        ("/api/v1/flows/", {"page": 1, "page_size": 500, "state": "Running", "ordering": "-id"}),
        ("/api/v1/nodes/", {"page": 1, "page_size": 500, "state": "Ready"}),
        ("/api/v1/jobs/", {"flat": "true", "format": "json"}),
        ("/api/v1/jobs/", {"array": 1}),
        ("/api/v1/events/", {"kind": "JobSubmitted", "node": "n1"}),
        ("/api/v1/queues/", {"page": "last", "page_size": 100000}),
        ("/api/v1/usage/", {"since": "2026-01-01", "group_by": "user,queue,day",
                            "format": "csv"}),
        ("/api/v1/tokens/", {"page": 1}),
    ],
)  # fmt: skip
def test_the_parameters_clients_send_still_work(api, owner, cluster, url, params):
    response = api(owner).get(url, params)
    assert response.status_code == 200, response.content


def test_filters_still_filter(api, owner, cluster):
    job, _ = cluster
    assert [j["id"] for j in api(owner).get("/api/v1/jobs/", {"state": "Pending"}).json()[
        "results"]] == [job.pk]  # fmt: skip
    assert api(owner).get("/api/v1/jobs/", {"state": "Running"}).json()["results"] == []
