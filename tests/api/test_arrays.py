"""Job arrays over /api/v1/jobs/: one spec, one row that expands, bad syntax named, ownership."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import Event, Job, Task
from scheduler.states.names import JobRequest, JobState

pytestmark = pytest.mark.django_db


def array_spec(array: Any, **fields: Any) -> dict[str, Any]:
    return {
        "name": "sweep",
        "array": array,
        **fields,
        "tasks": [{"name": "main", "replicas": 2, "command": "echo $BERTH_ARRAY_INDEX",
                   "resources": {"cpu": "0.5", "memory": "1Gi"}}],
    }  # fmt: skip


def submit(client: Any, array: Any, **fields: Any) -> dict[str, Any]:
    response = client.post("/api/v1/jobs/", array_spec(array, **fields), format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_it_submits_an_array_as_a_parent_and_one_job_per_index(api, owner):
    body = submit(api(owner), "0-4%2", walltime=60)
    parent = Job.objects.get(pk=body["id"])
    assert body["array"]["spec"] == "0-4%2"
    assert (body["array"]["size"], body["array"]["limit"]) == (5, 2)
    assert body["tasks"] == [] and not parent.tasks.exists()
    elements = list(Job.objects.filter(array_parent=parent).order_by("array_index"))
    assert [e.array_index for e in elements] == [0, 1, 2, 3, 4]
    assert all(e.spec.get("array") is None and e.walltime == 60 for e in elements)
    assert [e.hold_reason for e in elements] == ["", ""] + ["array limit: 2/2 active"] * 3
    assert Task.objects.filter(job__array_parent=parent).count() == 10
    # One event for the whole array, none per element.
    assert Event.objects.filter(job__array_parent=parent).count() == 0
    assert list(Event.objects.filter(job=parent).values_list("kind", flat=True)) == ["JobSubmitted"]


@pytest.mark.parametrize(
    ("array", "indices", "limit"),
    [
        ("1,3,5-7", [1, 3, 5, 6, 7], None),
        ("0-9:3", [0, 3, 6, 9], None),
        (" 2-3 % 1 ", [2, 3], 1),
        ("7", [7], None),
        (7, [7], None),
    ],
)
def test_it_accepts_lists_steps_and_a_limit(api, owner, array, indices, limit):
    body = submit(api(owner), array)
    assert body["array"]["limit"] == limit
    got = Job.objects.filter(array_parent_id=body["id"]).order_by("array_index")
    assert [j.array_index for j in got] == indices


@pytest.mark.parametrize(
    ("array", "why"),
    [
        ("0-", "not a number, a range"),
        ("5-1", "ends before it starts"),
        ("0-9%0", "at least 1"),
        ("0-9%x", "whole number"),
        ("0-9:0", "at least 1"),
        ("1,1", "more than once"),
        ("0-100000", "at most 100000 elements"),
        ("0-999999999", "indices must be at most"),
        ("", "must not be empty"),
        (True, "must be a string"),
        (-1, "must be a string"),
        ([1, 2], "must be a string"),
        ("0" * 2000, "at most 1000 characters"),
    ],
)
def test_it_refuses_bad_array_syntax_naming_the_field(api, owner, array, why):
    response = api(owner).post("/api/v1/jobs/", array_spec(array), format="json")
    assert response.status_code == 400, response.content
    assert why in " ".join(response.json()["array"])
    assert not Job.objects.exists() and not Task.objects.exists()  # nothing half-written


def test_it_bounds_the_array_size_by_setting(api, owner, settings):
    settings.BERTH_ARRAY_MAX_ELEMENTS = 3
    response = api(owner).post("/api/v1/jobs/", array_spec("0-3"), format="json")
    assert response.status_code == 400
    assert "at most 3 elements" in response.json()["array"][0]
    settings.BERTH_ARRAY_MAX_TASKS = 5  # 3 elements x 2 tasks = 6
    response = api(owner).post("/api/v1/jobs/", array_spec("0-2"), format="json")
    assert response.status_code == 400 and "at most 5 per array" in response.json()["array"][0]
    assert not Job.objects.exists()


def test_it_refuses_an_array_in_a_template(api, staff):
    spec = {k: v for k, v in array_spec("0-3").items() if k != "name"}
    response = api(staff).post("/api/v1/templates/", {"name": "t", "spec": spec}, format="json")
    assert response.status_code == 400 and "spec.array" in response.json()


def test_it_lists_an_array_as_one_row_with_counts(api, owner):
    client = api(owner)
    plain = client.post("/api/v1/jobs/", {**array_spec("0"), "array": None}, format="json")
    parent = submit(client, "0-2")
    rows = client.get("/api/v1/jobs/").json()["results"]
    assert [r["id"] for r in rows] == [parent["id"], plain.json()["id"]]
    assert rows[0]["array"]["counts"] == {"Pending": 3}
    assert rows[0]["array"]["elements"] == f"/api/v1/jobs/?array={parent['id']}"
    assert rows[1]["array"] is None

    elements = client.get(f"/api/v1/jobs/?array={parent['id']}").json()["results"]
    assert sorted((e["array_parent"], e["array_index"]) for e in elements) == [
        (parent["id"], 0), (parent["id"], 1), (parent["id"], 2),
    ]  # fmt: skip
    flat = client.get("/api/v1/jobs/?flat=true").json()
    assert flat["count"] == 5


def test_the_parent_spells_out_its_indices_per_state(api, owner):
    client = api(owner)
    parent = submit(client, "0-9%4")
    Job.objects.filter(array_parent_id=parent["id"], array_index__in=[0, 1]).update(
        state=JobState.RUNNING
    )
    body = client.get(f"/api/v1/jobs/{parent['id']}/").json()
    assert body["array"]["indices"] == {"Pending": "2-9", "Running": "0-1"}


def test_another_users_array_is_404(api, owner, outsider, staff):
    parent = submit(api(owner), "0-2")
    assert api(outsider).get(f"/api/v1/jobs/{parent['id']}/").status_code == 404
    assert api(outsider).post(f"/api/v1/jobs/{parent['id']}/cancel/").status_code == 404
    assert api(outsider).get(f"/api/v1/jobs/?array={parent['id']}").json()["count"] == 0
    element = Job.objects.filter(array_parent_id=parent["id"]).earliest("id")
    assert api(outsider).get(f"/api/v1/jobs/{element.pk}/").status_code == 404
    assert api(staff).get(f"/api/v1/jobs/{parent['id']}/").status_code == 200


def test_cancel_on_the_parent_reaches_every_element(api, owner):
    client = api(owner)
    parent = submit(client, "0-3")
    response = client.post(f"/api/v1/jobs/{parent['id']}/cancel/")
    assert response.status_code == 202, response.content
    elements = Job.objects.filter(array_parent_id=parent["id"])
    assert set(elements.values_list("requested_action", flat=True)) == {JobRequest.CANCEL}
    # The parent is not asked itself: it ends once its elements have stopped.
    assert Job.objects.get(pk=parent["id"]).requested_action == JobRequest.NONE
    assert response.json()["reason"] == "CancelRequested"
    assert response.json()["message"] == "by alice: 4 elements to stop"


def test_suspend_on_the_parent_is_refused_with_the_way_to_do_it(api, owner):
    parent = submit(api(owner), "0-3")
    response = api(owner).post(f"/api/v1/jobs/{parent['id']}/suspend/")
    assert response.status_code == 409
    assert f"?array={parent['id']}" in response.json()["detail"]


def test_an_element_can_be_cancelled_on_its_own(api, owner):
    parent = submit(api(owner), "0-3")
    element = Job.objects.get(array_parent_id=parent["id"], array_index=2)
    assert api(owner).post(f"/api/v1/jobs/{element.pk}/cancel/").status_code == 202
    asked = Job.objects.filter(array_parent_id=parent["id"], requested_action=JobRequest.CANCEL)
    assert list(asked.values_list("array_index", flat=True)) == [2]


def test_it_accepts_an_array_in_yaml(api, owner):
    body = "name: sweep\narray: 0-9:3%2\ntasks:\n- name: main\n  command: echo $BERTH_ARRAY_INDEX\n"
    response = api(owner).post("/api/v1/jobs/", body, content_type="application/yaml")
    assert response.status_code == 201, response.content
    assert (response.json()["array"]["spec"], response.json()["array"]["size"]) == ("0-9:3%2", 4)
