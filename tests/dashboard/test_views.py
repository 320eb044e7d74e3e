"""The pages: login, ownership (404 for others, never 403), forms with inline errors."""

from __future__ import annotations

import pytest
from django.test import Client

from scheduler.models import Flow, Job, JobTemplate, Node
from scheduler.states import JobState, NodeState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db
PAGES = ["/", "/jobs/", "/flows/", "/queues/", "/nodes/", "/submit/", "/submit/?kind=flow"]


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("url", PAGES)
def test_every_page_needs_a_login(url):
    response = Client().get(url)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.parametrize("url", PAGES)
def test_every_page_renders(owner, url):
    node = make_node("gpu-01", gpus=2)
    place(make_job(owner, gpu=1), node, devices=1)
    assert signed_in(owner).get(url).status_code == 200


def test_the_cluster_shows_each_gpu_with_the_job_holding_it(owner):
    node = make_node("gpu-01", gpus=2)
    job = make_job(owner, "trainer", gpu=1)
    place(job, node, devices=1)
    html = signed_in(owner).get("/").content.decode()
    assert 'id="node-' in html and "gpu-01" in html
    assert f'href="/jobs/{job.pk}/"' in html and f"held by job {job.pk} trainer of alice" in html


@pytest.mark.parametrize(("who", "status"), [("owner", 200), ("teammate", 404),
                                             ("outsider", 404), ("staff", 200)])  # fmt: skip
def test_job_and_flow_pages_belong_to_their_owner(request, owner, who, status):
    job = make_job(owner)
    flow = Flow.objects.create(name="f", owner=owner, spec={})
    client = signed_in(request.getfixturevalue(who))
    assert client.get(f"/jobs/{job.pk}/").status_code == status
    assert client.get(f"/flows/{flow.pk}/").status_code == status
    response = client.post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == (302 if status == 200 else 404)
    assert (Job.objects.get(pk=job.pk).requested_action == "cancel") == (status == 200)


def test_the_jobs_list_filters_and_pages_by_id(owner, outsider):
    for i in range(55):
        make_job(owner, f"job-{i}")
    make_job(outsider, "theirs")
    client = signed_in(owner)
    first = client.get("/jobs/").content.decode()
    assert "job-54" in first and "job-4<" not in first and "theirs" not in first
    assert "Older jobs" in first
    oldest = Job.objects.filter(owner=owner).order_by("id")[4].pk
    older = client.get(f"/jobs/?before={oldest + 1}").content.decode()
    assert "job-4<" in older and "job-5<" not in older
    Job.objects.filter(name="job-3").update(state=JobState.RUNNING)
    running = client.get("/jobs/?state=Running", HTTP_HX_REQUEST="true").content.decode()
    assert "job-3" in running and "job-2<" not in running and "<html" not in running
    assert "job-7" in client.get("/jobs/?q=job-7").content.decode()


def test_submitting_a_job_from_the_form_opens_its_page(owner):
    spec = "name: from-form\ntasks:\n- name: main\n  command: echo hi\n"
    response = signed_in(owner).post("/submit/", {"kind": "job", "spec": spec})
    job = Job.objects.get(name="from-form")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    htmx = signed_in(owner).post("/submit/", {"kind": "job", "spec": spec}, HTTP_HX_REQUEST="true")
    assert htmx["HX-Redirect"].startswith("/jobs/")


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ("name: x\ntasks:\n- command: 'true'\n  resources: {gpu: 1.5}\n", "tasks.0.resources.gpu"),
        ("name: [broken", "not valid YAML"),
        ("name: x\ntasks: []\n", "tasks</code>: must be a non-empty list"),
    ],
)
def test_form_errors_show_inline_and_nothing_is_created(owner, spec, shown):
    client = signed_in(owner)
    response = client.post("/submit/", {"kind": "job", "spec": spec}, HTTP_HX_REQUEST="true")
    # htmx swaps only 2xx responses, so the form with its errors comes back as a 200.
    assert response.status_code == 200
    html = response.content.decode()
    assert shown in html and 'role="alert"' in html and "<html" not in html
    plain = client.post("/submit/", {"kind": "job", "spec": spec})
    assert plain.status_code == 400 and shown in plain.content.decode()
    assert not Job.objects.exists()


def test_the_form_is_prefilled_from_a_template(owner):
    JobTemplate.objects.create(
        name="train", spec={"tasks": [{"name": "main", "command": "python t.py"}]}
    )
    html = signed_in(owner).get("/submit/?template=train").content.decode()
    assert "python t.py" in html and "name: train" in html


def test_a_flow_page_draws_its_dag(owner):
    from scheduler.submit import create_flow

    JobTemplate.objects.create(name="t", spec={"tasks": [{"name": "main", "command": "x"}]})
    flow = create_flow(owner, {"name": "f", "steps": [
        {"name": "a", "template": "t"}, {"name": "b", "template": "t", "depends_on": ["a"],
                                         "items": [{"X": "1"}, {"X": "2"}]}]})  # fmt: skip
    html = signed_in(owner).get(f"/flows/{flow.pk}/").content.decode()
    assert "<svg" in html and 'data-step="a"' in html and 'data-step="b"' in html
    assert "0/2 done" in html and '<path d="M' in html


def test_only_staff_cordon_nodes_from_the_page(owner, staff):
    make_node("gpu-01")
    assert signed_in(owner).post("/nodes/gpu-01/cordon/").status_code == 403
    assert signed_in(staff).post("/nodes/gpu-01/cordon/").status_code == 302
    assert Node.objects.get().state == NodeState.CORDONED
