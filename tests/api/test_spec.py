"""The spec as documented (docs/spec.md): every example in docs/examples/ submits, durations in
every documented form, resource defaults from the queue, typed schema components."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.duration import DurationError, parse_duration
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Job, Queue, Task
from tests.factories import make_node

pytestmark = pytest.mark.django_db

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
ENDPOINTS = {"template": "/api/v1/templates/", "job": "/api/v1/jobs/", "flow": "/api/v1/flows/"}
GI = 2**30


def _post_file(client, path: Path):
    kind = path.name.split("-", 1)[0]
    media = "application/json" if path.suffix == ".json" else "application/yaml"
    return client.post(ENDPOINTS[kind], path.read_bytes(), content_type=media)


def _spec_files() -> list[Path]:
    """The spec examples (scripts, such as jupyter.sh, are tested in tests/api/test_apps.py)."""
    return [p for p in EXAMPLES.iterdir() if p.suffix in (".yaml", ".json")]


def test_the_examples_cover_each_kind_in_yaml_and_json():
    names = [p.name for p in _spec_files()]
    assert {n.split("-", 1)[0] for n in names} == set(ENDPOINTS), names
    assert {Path(n).suffix for n in names} == {".yaml", ".json"}


def test_every_example_submits(api, owner, staff):
    files = sorted(_spec_files(), key=lambda p: list(ENDPOINTS).index(p.name.split("-")[0]))
    for path in files:  # templates first: the flow example names them
        client = api(staff if path.name.startswith("template-") else owner)
        response = _post_file(client, path)
        assert response.status_code == 201, (path.name, response.content)


# --- durations ---------------------------------------------------------------------------

GOOD_DURATIONS = [
    (90, 90), ("90", 90), ("90s", 90), ("45m", 2700), ("1h30m", 5400), ("2d", 172800),
    ("1d 12h", 129600), ("1H30M", 5400), ("30:00", 1800), ("01:30:00", 5400),
    ("100:00:00", 360000), ("1-00:00:00", 86400), ("1-12:30", 131400), ("2-3", 183600),
    (" 90 ", 90),
]  # fmt: skip
BAD_DURATIONS = [
    "", "soon", "1.5h", "1h30", "90x", "1:2:3:4", "01:60:00", "30:60", "1h1h", "-5", "a-01:00",
    "1-", ":30", "9" * 40, True, 1.5, [90], {"h": 1},
]  # fmt: skip


@pytest.mark.parametrize(("value", "seconds"), GOOD_DURATIONS)
def test_the_duration_parser_reads_each_documented_form(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_the_duration_parser_refuses_saying_which_forms_it_takes(value):
    with pytest.raises(DurationError, match="1h30m"):
        parse_duration(value)


def _job(**fields):
    return {"name": "j", "tasks": [{"command": "true"}], **fields}


@pytest.mark.parametrize(("value", "seconds"), GOOD_DURATIONS)
def test_walltime_takes_each_documented_form(api, owner, value, seconds):
    response = api(owner).post("/api/v1/jobs/", _job(walltime=value), format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.walltime == seconds and job.spec["walltime"] == seconds
    assert response.json()["walltime"] == seconds


@pytest.mark.parametrize("value", [*BAD_DURATIONS, 0, "0s", "00:00"])
def test_a_bad_walltime_is_a_400_naming_walltime_and_the_forms(api, owner, value):
    response = api(owner).post("/api/v1/jobs/", _job(walltime=value), format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert list(errors) == ["walltime"], errors
    assert ("1h30m" in errors["walltime"][0]) or ("at least 1" in errors["walltime"][0])
    assert not Job.objects.exists()


def test_a_yaml_walltime_in_slurm_form_is_read(api, owner):
    body = 'name: j\nwalltime: "1-00:00:00"\ntasks:\n  - command: "true"\n'
    response = api(owner).post("/api/v1/jobs/", body, content_type="application/yaml")
    assert response.status_code == 201, response.content
    assert response.json()["walltime"] == 86400


def test_deadline_and_ttl_take_durations_too(api, owner):
    spec = _job(active_deadline_seconds="2h", ttl_seconds_after_finished="1d")
    response = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["active_deadline_seconds"], body["ttl_seconds_after_finished"]) == (7200, 86400)
    bad = api(owner).post("/api/v1/jobs/", _job(active_deadline_seconds="later"), format="json")
    assert bad.status_code == 400 and "active_deadline_seconds" in bad.json()


def test_a_walltime_past_the_limit_is_refused(api, owner, settings):
    settings.BERTH_MAX_SECONDS = 3600
    response = api(owner).post("/api/v1/jobs/", _job(walltime="1h1s"), format="json")
    assert response.status_code == 400
    assert "at most 3600" in response.json()["walltime"][0]


def test_a_null_number_means_its_default(api, owner):
    """Found by the fuzz test once the schema was typed: `priority: null` was a 500."""
    spec = _job(priority=None, max_retry=None, min_available=None)
    response = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["priority"], response.json()["max_retry"]) == (0, 0)


# --- resource defaults from the queue ----------------------------------------------------


def test_a_task_without_resources_gets_the_queues_defaults(api, owner):
    response = api(owner).post("/api/v1/jobs/", _job(), format="json")
    assert response.status_code == 201, response.content
    resources = response.json()["spec"]["tasks"][0]["resources"]
    assert resources == {"cpu": "1", "memory": "1Gi", "gpu": 0}
    task = Task.objects.get(job_id=response.json()["id"])
    assert (task.cpu, task.memory, task.gpu) == (1000, GI, 0)


def test_given_resources_are_kept_and_missing_ones_filled(api, owner, staff):
    api(staff).post("/api/v1/queues/", {"name": "small", "default_cpu": "250m",
                                        "default_memory": "512Mi"}, format="json")  # fmt: skip
    spec = {"name": "j", "queue": "small", "tasks": [
        {"name": "a", "command": "true", "resources": {"gpu": 1}},
        {"name": "b", "command": "true", "resources": {"cpu": 0, "memory": "2Gi"}},
    ]}  # fmt: skip
    response = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    groups = {t["name"]: t["resources"] for t in response.json()["spec"]["tasks"]}
    assert groups["a"] == {"cpu": "0.25", "memory": "512Mi", "gpu": 1}
    assert groups["b"] == {"cpu": "0", "memory": "2Gi", "gpu": 0}


def test_a_flow_steps_job_gets_the_defaults_of_its_queue(api, owner, staff):
    template = {"name": "t", "spec": {"tasks": [{"command": "true"}]}}
    assert api(staff).post("/api/v1/templates/", template, format="json").status_code == 201
    Queue.objects.filter(name="default").update(default_cpu=2000, default_memory=2 * GI)
    flow = {"name": "f", "steps": [{"name": "a", "template": "t", "overrides": {"walltime": "5m"}}]}
    response = api(owner).post("/api/v1/flows/", flow, format="json")
    assert response.status_code == 201, response.content
    run_scheduler_cycle()
    job = Job.objects.get(flow_id=response.json()["id"])
    assert job.spec["tasks"][0]["resources"] == {"cpu": "2", "memory": "2Gi", "gpu": 0}
    assert job.walltime == 300


def test_staff_set_a_queues_defaults_as_users_write_them(api, staff):
    client = api(staff)
    assert client.get("/api/v1/queues/default/").json()["default_cpu"] == "1"
    response = client.patch("/api/v1/queues/default/", {"default_cpu": 2,
                            "default_memory": "4Gi"}, format="json")  # fmt: skip
    assert response.status_code == 200, response.content
    assert (response.json()["default_cpu"], response.json()["default_memory"]) == ("2", "4Gi")
    assert Queue.objects.get(name="default").default_memory == 4 * GI
    bad = client.patch("/api/v1/queues/default/", {"default_cpu": "lots"}, format="json")
    assert bad.status_code == 400 and "default_cpu" in bad.json()


def test_the_scheduler_places_tasks_by_the_queues_defaults(api, owner):
    Queue.objects.filter(name="default").update(default_cpu=3000)
    make_node("n1", cpu=4000)
    ids = [api(owner).post("/api/v1/jobs/", _job(name=f"j{i}"), format="json").json()["id"]
           for i in range(2)]  # fmt: skip
    report = run_scheduler_cycle()
    # 3 cpu each on a 4-cpu node: one is bound, the other waits (with 0 cpu both would be).
    placed = Task.objects.filter(job_id__in=ids, node__isnull=False)
    assert placed.count() == 1 and placed.get().cpu == 3000, report


# --- the schema --------------------------------------------------------------------------


def test_the_schema_types_the_specs_with_examples(api, owner):
    schema = api(owner).get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]
    for name in ("JobSpec", "TaskSpec", "ResourcesSpec", "TemplateSpec", "FlowSpec",
                 "FlowStepSpec", "StepOverrides"):  # fmt: skip
        assert components[name]["type"] == "object", name
    assert components["JobSpec"]["properties"]["tasks"]["items"]["$ref"].endswith("/TaskSpec")
    assert {"integer", "string"} == {
        o["type"] for o in components["JobSpec"]["properties"]["walltime"]["oneOf"]
    }
    for path, ref in (("/api/v1/jobs/", "JobSpec"), ("/api/v1/flows/", "FlowSpec"),
                      ("/api/v1/templates/", "TemplateSpec")):  # fmt: skip
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"].endswith(f"/{ref}")
        assert body["examples"], path
    job = components["Job"]["properties"]["spec"]
    assert "JobSpec" in str(job)


def test_the_schema_describes_both_tokens_as_authorization_headers(api, owner):
    schemes = api(owner).get("/api/schema/?format=json").json()["components"]["securitySchemes"]
    for name, words in (("tokenAuth", "`Token <key>` or `Bearer <key>`"),
                        ("nodeToken", 'sent as "Node <token>"')):  # fmt: skip
        scheme = schemes[name]
        where = (scheme["type"], scheme["in"], scheme["name"])
        assert where == ("apiKey", "header", "Authorization"), name
        assert words in scheme["description"], name
