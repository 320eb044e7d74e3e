"""The submit form: a YAML editor prefilled from a template, inline errors, the new page."""

from __future__ import annotations

import pytest

from scheduler.models import Flow, Job, JobTemplate

pytestmark = pytest.mark.django_db


def test_submitting_a_job_opens_its_page(owner, signed_in):
    spec = "name: from-form\ntasks:\n- name: main\n  command: echo hi\n"
    response = signed_in(owner).post("/submit/", {"kind": "job", "spec": spec})
    job = Job.objects.get(name="from-form")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.owner == owner
    htmx = signed_in(owner).post("/submit/", {"kind": "job", "spec": spec}, HTTP_HX_REQUEST="true")
    assert htmx.status_code == 204 and htmx["HX-Redirect"].startswith("/jobs/")


def test_submitting_a_flow_opens_its_page(owner, signed_in):
    JobTemplate.objects.create(name="t", spec={"tasks": [{"name": "main", "command": "x"}]})
    spec = "name: sweep\nsteps:\n- name: a\n  template: t\n  items: [{LR: '0.1'}]\n"
    response = signed_in(owner).post("/submit/", {"kind": "flow", "spec": spec},
                                     HTTP_HX_REQUEST="true")  # fmt: skip
    flow = Flow.objects.get(name="sweep")
    assert response["HX-Redirect"] == f"/flows/{flow.pk}/" and flow.owner == owner


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ("name: x\ntasks:\n- command: 'true'\n  resources: {gpu: 1.5}\n", "tasks.0.resources.gpu"),
        ("name: [broken", "not valid YAML"),
        ("name: x\ntasks: []\n", "tasks</code>: must be a non-empty list"),
    ],
)
def test_errors_show_inline_naming_the_field_and_nothing_is_created(owner, signed_in, spec, shown):
    client = signed_in(owner)
    response = client.post("/submit/", {"kind": "job", "spec": spec}, HTTP_HX_REQUEST="true")
    # htmx swaps only 2xx responses, so the form with its errors comes back as a 200.
    assert response.status_code == 200
    html = response.content.decode()
    assert shown in html and 'role="alert"' in html and "<html" not in html
    assert 'id="submit-form"' in html  # the user's text is kept in the editor
    plain = client.post("/submit/", {"kind": "job", "spec": spec})
    assert plain.status_code == 400 and shown in plain.content.decode()
    assert not Job.objects.exists()


def test_flow_errors_name_the_step_field(owner, signed_in):
    spec = "name: f\nsteps:\n- name: a\n  template: missing\n"
    html = signed_in(owner).post("/submit/", {"kind": "flow", "spec": spec},
                                 HTTP_HX_REQUEST="true").content.decode()  # fmt: skip
    assert "steps.0" in html and 'role="alert"' in html and not Flow.objects.exists()


def test_the_editor_is_prefilled_from_a_chosen_template(owner, signed_in):
    JobTemplate.objects.create(
        name="train", spec={"tasks": [{"name": "main", "command": "python t.py"}]}
    )
    client = signed_in(owner)
    html = client.get("/submit/?template=train").content.decode()
    assert "python t.py" in html and "name: train" in html
    partial = client.get("/submit/?template=train&kind=job", HTTP_HX_REQUEST="true")
    assert "python t.py" in partial.content.decode() and "<html" not in partial.content.decode()
    flow = client.get("/submit/?template=train&kind=flow").content.decode()
    assert "template: train" in flow and "steps:" in flow
