"""Request bodies are parsed with bounds: size, nesting, YAML aliases, text that cannot be stored.

Each hostile body gets a small 4xx naming the field, and nothing is written."""

from __future__ import annotations

import json

import pytest

from scheduler.models import Flow, Job, JobTemplate, Node, Queue

pytestmark = pytest.mark.django_db

JOB = {"name": "ok", "tasks": [{"command": "true"}]}
YAML_BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]",
        "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]",
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]",
        "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]",
        "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]",
        "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]",
        "name: [*g,*g,*g,*g,*g,*g,*g,*g,*g]",
        "tasks: [{command: 'true'}]",
    ]
)


def post(client, url, body: str | bytes, content_type: str = "application/json"):
    return client.post(url, data=body, content_type=content_type)


def test_a_yaml_alias_bomb_is_refused_small(api, owner):
    response = post(api(owner), "/api/v1/jobs/", YAML_BOMB, "application/yaml")
    assert response.status_code == 400
    assert len(response.content) < 2000
    assert "aliases" in response.json()["body"][0]
    assert not Job.objects.exists()


def test_a_yaml_anchor_without_alias_is_refused_too(api, owner):
    body = "name: &n ok\ntasks: [{command: 'true'}]\n"
    response = post(api(owner), "/api/v1/jobs/", body, "application/yaml")
    assert response.status_code == 400 and "body" in response.json()


@pytest.mark.parametrize("depth", [65, 100_000])
def test_deep_yaml_is_refused(api, owner, depth):
    response = post(api(owner), "/api/v1/jobs/", "[" * depth + "]" * depth, "application/yaml")
    assert response.status_code == 400
    assert "nested deeper than 64 levels" in response.json()["body"][0]


@pytest.mark.parametrize("depth", [65, 100_000])
def test_deep_json_is_refused(api, owner, depth):
    body = '{"name": "x", "tasks": ' + "[" * depth + "]" * depth + "}"
    response = post(api(owner), "/api/v1/jobs/", body)
    assert response.status_code == 400
    assert "nested deeper than 64 levels" in json.dumps(response.json())
    assert not Job.objects.exists()


def test_nesting_within_the_limit_reaches_validation(api, owner):
    body = {"name": "x", "tasks": [{"command": "true", "env": {"A": [[[[["deep"]]]]]}}]}
    response = api(owner).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert "tasks.0.env.A" in response.json()


def test_yaml_builds_only_json_types(api, owner):
    body = "name: ok\nlabels: {when: 2024-01-01}\ntasks: [{command: 'true'}]\n"
    response = post(api(owner), "/api/v1/jobs/", body, "application/yaml")
    assert response.status_code == 201, response.content
    assert response.json()["labels"] == {"when": "2024-01-01"}
    tagged = "name: ok\ntasks: [{command: !!binary aGk=}]\n"
    response = post(api(owner), "/api/v1/jobs/", tagged, "application/yaml")
    assert response.status_code == 400 and "not valid YAML" in response.json()["detail"]


def test_a_body_over_the_limit_is_413(api, owner, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    body = json.dumps({**JOB, "labels": {"x": "y" * 100_000}})
    for content_type in ("application/json", "application/yaml"):
        response = post(api(owner), "/api/v1/jobs/", body, content_type)
        assert response.status_code == 413
        assert len(response.content) < 500
    assert not Job.objects.exists()


def test_huge_numbers_are_refused_by_path(api, owner, staff):
    body = '{"name": "x", "priority": 1' + "0" * 4000 + ', "tasks": [{"command": "true"}]}'
    response = post(api(owner), "/api/v1/jobs/", body)
    assert response.status_code == 400
    assert response.json() == {"priority": ["number out of range"]}
    response = api(staff).post("/api/v1/queues/", {"name": "q", "priority": 2**40}, format="json")
    assert response.status_code == 400 and "priority" in response.json()
    assert not Job.objects.exists() and not Queue.objects.filter(name="q").exists()


def test_a_json_syntax_error_is_never_echoed_in_full(api, owner):
    response = post(api(owner), "/api/v1/jobs/", '{"name": "' + "x" * 1_000_000)
    assert response.status_code == 400
    assert len(response.content) < 1000


BAD_TEXT = ["a\x00b", "a\ud800b"]


@pytest.mark.parametrize("text", BAD_TEXT, ids=["nul", "surrogate"])
@pytest.mark.parametrize(
    ("make", "path"),
    [
        (lambda t: {**JOB, "name": t}, "name"),
        (lambda t: {**JOB, "tasks": [{"command": t}]}, "tasks.0.command"),
        (lambda t: {**JOB, "tasks": [{"command": "x", "env": {"K": t}}]}, "tasks.0.env.K"),
        (lambda t: {**JOB, "labels": {"team": t}}, "labels.team"),
        (lambda t: {**JOB, "labels": {t: "v"}}, "labels"),
    ],
)
def test_text_that_cannot_be_stored_is_refused_in_jobs(api, owner, text, make, path):
    # Written by hand: the JSON encoder would refuse a lone surrogate itself.
    body = json.dumps(make(text), ensure_ascii=True)
    response = post(api(owner), "/api/v1/jobs/", body)
    assert response.status_code == 400, response.content
    assert path in response.json()
    assert not Job.objects.exists()


@pytest.mark.parametrize("text", BAD_TEXT, ids=["nul", "surrogate"])
def test_text_that_cannot_be_stored_is_refused_everywhere(api, owner, staff, text):
    Node.objects.create(name="n1", cpu=1000, memory=2**30)
    cases = [
        ("post", "/api/v1/queues/", {"name": text}, "name"),
        ("patch", "/api/v1/nodes/n1/", {"labels": {"a": text}}, "labels.a"),
        ("post", "/api/v1/templates/", {"name": "t", "description": text,
                                        "spec": {"tasks": [{"command": "x"}]}}, "description"),
        ("post", "/api/v1/flows/", {"name": text, "steps": []}, "name"),
    ]  # fmt: skip
    for method, url, data, path in cases:
        body = json.dumps(data, ensure_ascii=True)
        response = getattr(api(staff), method)(url, data=body, content_type="application/json")
        assert response.status_code == 400, (url, response.content)
        assert path in response.json(), (url, response.json())
    assert Node.objects.get(name="n1").labels == {}
    assert not Queue.objects.exclude(name="default").exists()
    assert not JobTemplate.objects.exists() and not Flow.objects.exists()


def test_form_bodies_are_checked_too(api, staff):
    response = api(staff).post(
        "/api/v1/queues/", data="name=a%00b", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400 and "name" in response.json()


@pytest.mark.parametrize("kind", ["nodes", "queues", "templates"])
def test_a_name_with_nul_in_the_path_is_refused(api, staff, kind):
    response = api(staff).get(f"/api/v1/{kind}/a%00b/")
    assert response.status_code == 400 and "path" in response.json()
    assert api(staff).delete(f"/api/v1/{kind}/a%00b/").status_code == 400


def test_the_api_lookup_itself_never_matches_a_nul(staff):
    from django.urls import Resolver404, resolve

    with pytest.raises(Resolver404):
        resolve("/api/v1/nodes/a\x00b/")


@pytest.mark.parametrize("query", ["state=%00", "owner=a%00", "queue=%00", "flow=%00"])
def test_nul_in_a_filter_is_a_400(api, owner, query):
    assert api(owner).get(f"/api/v1/jobs/?{query}").status_code == 400
