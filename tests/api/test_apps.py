"""A job's web app in its spec (`apps`, `berth submit --app`, docs/interactive.md#web-apps):
checked at submit with 400s naming the field; the Jupyter example script submits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from berth.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def _job(**fields: Any) -> dict[str, Any]:
    return {"name": "app", "tasks": [{"name": "main", "command": "true"}], **fields}


@pytest.mark.parametrize(
    ("apps", "stored"),
    [("jupyter", [{"kind": "jupyter"}]), ([{"kind": "http"}], [{"kind": "http"}]),
     (["http"], [{"kind": "http"}])],
)  # fmt: skip
def test_it_takes_one_app_of_a_known_kind(api, owner, apps, stored):
    response = api(owner).post("/api/v1/jobs/", _job(apps=apps), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["spec"]["apps"] == stored


def test_a_job_without_an_app_keeps_its_spec_unchanged(api, owner):
    response = api(owner).post("/api/v1/jobs/", _job(), format="json")
    assert "apps" not in response.json()["spec"]


@pytest.mark.parametrize(
    ("apps", "field"),
    [("vscode", "apps.0.kind"), ([{"kind": "http"}, {"kind": "jupyter"}], "apps"),
     ([{"kind": "http", "port": 80}], "apps.0.port"), ({"kind": "http"}, "apps"),
     (7, "apps"), ([{}], "apps.0.kind"), ("x" * 10_000, "apps.0.kind")],
)  # fmt: skip
def test_a_bad_app_is_a_400_naming_the_field(api, owner, apps, field):
    response = api(owner).post("/api/v1/jobs/", _job(apps=apps), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert len(response.content) < 2000  # the bad value is never echoed whole


class Posted:
    specs: list[Any] = []

    def post(self, path: str, body: Any = None) -> dict[str, Any]:
        Posted.specs.append(body)
        return {"id": 7}


def test_the_app_option_and_the_jupyter_example_submit(api, owner, monkeypatch):
    monkeypatch.setattr(main, "client", Posted)
    Posted.specs = []
    runner = CliRunner()
    result = runner.invoke(main.cli, ["submit", "--app", "http", "--", "python3 -m http.server"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main.cli, ["submit", str(EXAMPLES / "jupyter.sh")])
    assert result.exit_code == 0, result.output
    by_option, example = Posted.specs
    assert by_option["apps"] == [{"kind": "http"}]
    assert example["apps"] == [{"kind": "jupyter"}] and example["walltime"] == 4 * 3600
    assert '--ServerApp.base_url="$BERTH_APP_BASE_URL"' in example["tasks"][0]["command"]
    for spec in (by_option, example):
        assert api(owner).post("/api/v1/jobs/", spec, format="json").status_code == 201
