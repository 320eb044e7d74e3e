"""The nodes page: cards for everyone, cordon/uncordon/drain for staff only."""

from __future__ import annotations

import pytest

from scheduler.models import Node
from scheduler.states.names import NodeState
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def test_only_staff_see_and_use_node_actions(owner, staff, signed_in):
    make_node("gpu-01")
    html = signed_in(owner).get("/nodes/").content.decode()
    assert "gpu-01" in html and "/cordon/" not in html
    assert signed_in(owner).post("/nodes/gpu-01/cordon/").status_code == 403
    assert Node.objects.get().state == NodeState.READY
    html = signed_in(staff).get("/nodes/").content.decode()
    assert 'action="/nodes/gpu-01/cordon/"' in html and "csrfmiddlewaretoken" in html
    assert signed_in(staff).post("/nodes/gpu-01/cordon/").status_code == 302
    assert Node.objects.get().state == NodeState.CORDONED


def test_an_htmx_action_swaps_the_card_in_place(staff, signed_in):
    node = make_node("gpu-01")
    client = signed_in(staff)
    response = client.post("/nodes/gpu-01/drain/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert f'id="node-{node.pk}"' in html and 'hx-swap-oob="true"' in html
    assert "state-draining" in html
    client.post("/nodes/gpu-01/uncordon/", HTTP_HX_REQUEST="true")
    assert Node.objects.get().state == NodeState.READY


def test_unknown_nodes_and_actions_are_refused(staff, signed_in):
    make_node("gpu-01")
    client = signed_in(staff)
    assert client.post("/nodes/nope/cordon/").status_code == 404
    assert client.post("/nodes/gpu-01/reboot/").status_code == 403
    assert client.get("/nodes/gpu-01/cordon/").status_code == 405
