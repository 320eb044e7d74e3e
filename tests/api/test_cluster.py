"""/api/v1/queues/, /nodes/ (+ cordon, uncordon, drain) and /events/."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from scheduler.models import Event, Node, Queue
from scheduler.states.names import NodeState, TaskState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


def test_queues_are_read_by_all_and_written_by_staff(api, owner, staff):
    body = {"name": "research", "weight": 2, "capability": {"gpu": 16, "memory": "1Ti"}}
    assert api(owner).post("/api/v1/queues/", body, format="json").status_code == 403
    response = api(staff).post("/api/v1/queues/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["capability"] == {"gpu": 16, "memory": "1Ti"}
    assert Queue.objects.get(name="research").capability == {"gpu": 16, "memory": 2**40}
    names = [q["name"] for q in api(owner).get("/api/v1/queues/").json()["results"]]
    assert names == ["default", "research"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "q", "weight": 0}, "weight"),
        ({"name": "q", "capability": {"gpu": 1.5}}, "capability.gpu"),
        ({"name": "q", "capability": {"disk": 1}}, "capability.disk"),
        ({"name": "Q Q"}, "name"),
    ],
)
def test_a_bad_queue_is_named(api, staff, body, field):
    response = api(staff).post("/api/v1/queues/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_nodes_show_devices_and_who_holds_them(api, owner):
    node = make_node("gpu-01", gpus=2, labels={"gpu-model": "h100"})
    job = make_job(owner, gpu=1)
    place(job, node, devices=1)
    body = api(owner).get("/api/v1/nodes/gpu-01/").json()
    assert (body["state"], body["cpu"], body["memory"]) == ("Ready", "8", "32Gi")
    assert [(d["index"], d["job"]) for d in body["devices"]] == [(0, job.pk), (1, None)]
    assert body["allocated"] == {"cpu": "1", "memory": "1Gi", "gpu": 1}


def test_staff_cordon_uncordon_and_drain_a_node(api, owner, staff):
    make_node("gpu-01")
    assert api(owner).post("/api/v1/nodes/gpu-01/cordon/").status_code == 403
    assert api(staff).post("/api/v1/nodes/gpu-01/cordon/").json()["state"] == "Cordoned"
    assert api(staff).post("/api/v1/nodes/gpu-01/uncordon/").json()["state"] == "Ready"
    assert api(staff).post("/api/v1/nodes/gpu-01/drain/").json()["state"] == "Draining"
    assert list(Event.objects.filter(node__name="gpu-01").values_list("kind", flat=True)) == [
        "NodeDraining", "NodeUncordoned", "NodeCordoned",
    ]  # fmt: skip


def test_a_not_ready_node_stays_not_ready_when_cordoned(api, staff):
    make_node("gpu-01", state=NodeState.NOT_READY)
    body = api(staff).post("/api/v1/nodes/gpu-01/cordon/").json()
    assert (body["state"], body["admin_state"]) == ("NotReady", "Cordoned")
    assert Node.objects.get().derive_state(alive=True) == "Cordoned"


def test_staff_relabel_a_node_and_users_cannot(api, owner, staff):
    make_node("gpu-01")
    assert (
        api(owner).patch("/api/v1/nodes/gpu-01/", {"labels": {"a": "b"}}, format="json").status_code
        == 403
    )  # noqa: E501
    response = api(staff).patch("/api/v1/nodes/gpu-01/", {"labels": {"a": "b"}}, format="json")
    assert response.json()["labels"] == {"a": "b"}
    bad = api(staff).patch("/api/v1/nodes/gpu-01/", {"labels": {"a": 1}}, format="json")
    assert bad.status_code == 400 and "labels.a" in bad.json()


def test_events_show_own_jobs_and_cluster_events_only(api, owner, outsider, staff):
    mine = make_job(owner)
    theirs = make_job(outsider)
    node = make_node("n1")
    Event.objects.create(kind="A", job=mine)
    Event.objects.create(kind="B", job=theirs)
    Event.objects.create(kind="C", node=node)
    kinds = {e["kind"] for e in api(owner).get("/api/v1/events/").json()["results"]}
    assert kinds == {"A", "C"}
    assert len(api(staff).get("/api/v1/events/").json()["results"]) == 3
    assert api(None).get("/api/v1/events/").status_code in (401, 403)


def test_the_schema_is_valid_and_the_docs_page_works_offline(owner):
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.validation import validate_schema

    schema = SchemaGenerator().get_schema(request=None, public=True)
    validate_schema(schema)
    assert "/api/v1/jobs/{id}/cancel/" in schema["paths"]
    client = Client()
    client.force_login(owner)
    page = client.get("/api/docs/")
    assert page.status_code == 200
    # Nothing loaded from another host (the page's CSRF token is random text, so a bare
    # search for "cdn" failed about once in a thousand runs).
    assert not re.search(rb"""(src|href)\s*=\s*["']?(https?:)?//""", page.content, re.I)
    assert b"/static/drf_spectacular_sidecar/" in page.content
    assert client.get("/api/schema/").status_code == 200


def test_task_states_are_shown(api, owner):
    node = make_node("n1")
    job = make_job(owner)
    place(job, node, state=TaskState.ASSIGNED)
    (task,) = api(owner).get(f"/api/v1/jobs/{job.pk}/").json()["tasks"]
    assert (task["node"], task["state"], task["devices"]) == ("n1", "Assigned", [])


def test_me_says_who_the_caller_is(api, owner, staff):
    assert api(owner).get("/api/v1/me/").json() == {"username": "alice", "is_staff": False}
    assert api(staff).get("/api/v1/me/").json() == {"username": "admin", "is_staff": True}
    assert api(None).get("/api/v1/me/").status_code in (401, 403)
