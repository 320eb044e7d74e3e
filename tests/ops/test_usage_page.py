"""The usage page: GPU-hours per user and day for a window; your own, or everyone's for staff."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.factories import make_usage

pytestmark = pytest.mark.django_db


def _page(user, query: str = ""):
    client = Client()
    client.force_login(user)
    return client.get(f"/usage/{query}")


def _chart(response) -> dict:
    html = response.content.decode()
    return json.loads(html.split('<script id="usage-data" type="application/json">')[1]
                      .split("</script>")[0])  # fmt: skip


def test_a_user_sees_only_their_own_gpu_hours_per_day(owner, teammate):
    make_usage(owner, gpu_seconds=2.0 * 3600, days_ago=1, job_id=1, task_id=1)
    make_usage(owner, gpu_seconds=3.0 * 3600, days_ago=3, job_id=2, task_id=2)
    make_usage(teammate, gpu_seconds=7.0 * 3600, days_ago=1, job_id=3, task_id=3)
    response = _page(owner)
    assert response.status_code == 200
    chart = _chart(response)
    assert [s["label"] for s in chart["series"]] == ["alice"]
    assert len(chart["x"]) == 31  # the last 30 days and today
    assert sorted(v for v in chart["series"][0]["values"] if v) == [2.0, 3.0]
    assert "uPlot-1.6.32.iife.min.js" in response.content.decode()


def test_staff_see_everyone_and_can_pick_a_user(owner, teammate, staff):
    make_usage(owner, gpu_seconds=2.0 * 3600, days_ago=1, job_id=1, task_id=1)
    make_usage(teammate, gpu_seconds=7.0 * 3600, days_ago=1, job_id=2, task_id=2)
    assert [s["label"] for s in _chart(_page(staff))["series"]] == ["alice", "bob"]
    assert [s["label"] for s in _chart(_page(staff, "?user=bob"))["series"]] == ["bob"]


def test_a_window_chooses_the_days(owner):
    make_usage(owner, gpu_seconds=2.0 * 3600, days_ago=1, job_id=1, task_id=1)
    day = (timezone.now() - timedelta(days=1, minutes=1)).date().isoformat()
    chart = _chart(_page(owner, f"?since={day}&until={day}"))
    assert len(chart["x"]) == 1 and chart["series"][0]["values"] == [2.0]


def test_a_bad_window_is_named(owner):
    response = _page(owner, "?since=tomorrowish")
    assert response.status_code == 400
    assert "<code>since</code>" in response.content.decode()


def test_it_says_so_when_nothing_ran(owner):
    html = _page(owner).content.decode()
    assert "No task ended in this window." in html and 'href="/usage/"' in html
