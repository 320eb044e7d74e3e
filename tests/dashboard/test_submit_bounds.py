"""The submit form parses YAML with the API's bounds: an alias bomb, deep nesting or a NUL is
refused inline, small and fast, and nothing is created."""

from __future__ import annotations

import pytest

from scheduler.models import Job
from tests.api.test_bodies import YAML_BOMB

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        (YAML_BOMB, "anchors and aliases"),
        ("[" * 100_000, "nested deeper than 64 levels"),
        ('name: x\ntasks:\n- command: "a\\0b"\n', "must not contain NUL"),
    ],
    ids=["alias-bomb", "deep", "nul"],
)
def test_hostile_yaml_is_refused_inline(owner, signed_in, spec, shown):
    response = signed_in(owner).post("/submit/", {"kind": "job", "spec": spec})
    assert response.status_code == 400
    page = response.content.decode()
    assert shown in page and len(page) < 200_000 + 2 * len(spec)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/jobs/?state=%00"),
        ("get", "/jobs/?q=a%00"),
        ("get", "/submit/?template=%00"),
        ("post", "/nodes/a%00/cordon/"),
    ],
)
def test_nul_in_a_page_url_is_a_400_not_a_500(staff, signed_in, method, url):
    response = getattr(signed_in(staff), method)(url)
    assert response.status_code == 400
