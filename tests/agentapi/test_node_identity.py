"""Node identity: the join token registers new names only; a node registers again with its own
token, or after staff reset it (REST or admin); only the token's hash is stored."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from scheduler.models import Event, Node
from tests.agentapi.test_protocol import JOIN, NODE, _assigned, beat, register, rows

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


def test_the_join_token_cannot_register_a_taken_name_and_changes_nothing(owner):
    token = register().json()["token"]
    _assigned(owner, Node.objects.get())
    before = rows()
    response = register({**NODE, "cpu": "128", "labels": {"evil": "yes"}})
    assert response.status_code == 409
    assert "'gpu-01' is already registered" in response.json()["name"][0]
    assert rows() == before  # no token, device, label or event changed
    answer = beat(token).json()  # the real agent is still the node, and gets its work
    assert [s["command"] for s in answer["start"]] == ["echo hi"]


def test_a_node_registers_again_with_its_own_token_and_keeps_it():
    token = register().json()["token"]
    again = register({**NODE, "cpu": "16"}, token=token, scheme="Node")
    assert again.status_code == 200 and again.json()["token"] == token
    assert Node.objects.get().cpu == 16000
    assert beat(token).status_code == 200


def test_a_node_token_acts_only_for_its_own_node():
    token = register().json()["token"]
    register({**NODE, "name": "gpu-02"})
    other = register({**NODE, "name": "gpu-02", "cpu": "1"}, token=token, scheme="Node")
    assert other.status_code == 403 and "belongs to node 'gpu-01'" in other.json()["name"][0]
    assert Node.objects.get(name="gpu-02").cpu == 8000
    for unknown in ("", "not-a-token"):
        response = register(token=unknown, scheme="Node")
        assert response.status_code == 401 and "unknown node token" in str(response.json())


def test_a_node_registers_again_with_its_token_while_joining_is_closed(settings):
    token = register().json()["token"]
    settings.BERTH_JOIN_TOKEN = ""
    assert register(token=token, scheme="Node").status_code == 200


def test_only_the_hash_of_a_node_token_is_stored():
    token = register().json()["token"]
    stored = [str(v) for v in Node.objects.values().get().values()]
    assert all(token not in value for value in stored)
    assert Node.objects.get().token_hash not in (None, "", token)


def test_staff_reset_a_node_token_over_rest_and_the_name_can_join_again(api, owner, staff):
    token = register().json()["token"]
    assert api(owner).post("/api/v1/nodes/gpu-01/reset-token/").status_code == 403
    assert register().status_code == 409
    response = api(staff).post("/api/v1/nodes/gpu-01/reset-token/")
    assert response.status_code == 200 and response.json()["name"] == "gpu-01"
    assert beat(token).status_code == 401  # the old token is dead
    rejoined = register()
    assert rejoined.status_code == 201 and beat(rejoined.json()["token"]).status_code == 200
    assert Event.objects.filter(kind="NodeTokenReset", node__name="gpu-01").exists()


def test_staff_reset_a_node_token_from_the_admin(staff):
    token = register().json()["token"]
    console = Client()
    console.force_login(staff)
    response = console.post(
        reverse("admin:scheduler_node_changelist"),
        {"action": "reset_token", "_selected_action": [Node.objects.get().pk]},
    )
    assert response.status_code == 302
    assert Node.objects.get().token_hash is None and beat(token).status_code == 401


def test_a_deleted_node_name_can_join_again(api, staff):
    register()
    assert api(staff).delete("/api/v1/nodes/gpu-01/").status_code == 204
    assert register().status_code == 201


def test_the_start_message_names_the_jobs_owner(owner):
    token = register().json()["token"]
    _assigned(owner, Node.objects.get())
    (start,) = beat(token).json()["start"]
    assert start["owner"] == owner.username


def test_a_join_token_is_not_a_node_token():
    register()
    response = register(token=JOIN, scheme="Node")
    assert response.status_code == 401
