"""/healthz: no login; 200 while the database, the channel layer and the scheduler answer,
503 naming the part that does not."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client

from scheduler.models import SchedulerHeartbeat

pytestmark = pytest.mark.django_db


def _health() -> tuple[int, dict]:
    response = Client().get("/healthz")
    return response.status_code, response.json()


def test_it_is_healthy_after_a_scheduler_cycle():
    call_command("run_scheduler", "--once", stdout=io.StringIO())
    status, body = _health()
    assert status == 200, body
    assert body["database"] == body["channel_layer"] == body["scheduler"] == "ok"
    assert 0 <= body["last_cycle_age_seconds"] < 60
    assert Client().get("/healthz/").status_code == 200


def test_it_turns_503_naming_the_scheduler_when_cycles_stop(settings):
    call_command("run_scheduler", "--once", "--interval", "2", stdout=io.StringIO())
    row = SchedulerHeartbeat.objects.get()
    assert row.interval_seconds == 2 and row.cycles == 1
    row.last_cycle_at -= timedelta(seconds=11)  # more than 5 intervals of 2 s
    row.save()
    status, body = _health()
    assert status == 503
    assert body["scheduler"].startswith("no cycle for 1")
    assert body["last_cycle_age_seconds"] >= 11
    assert body["database"] == body["channel_layer"] == "ok"
    row.last_cycle_at += timedelta(seconds=5)  # 6 s old: within 5 intervals again
    row.save()
    assert _health()[0] == 200


def test_it_is_503_before_any_scheduler_cycle_ran():
    status, body = _health()
    assert status == 503
    assert body["scheduler"] == "no scheduler cycle recorded yet"
    assert body["last_cycle_age_seconds"] is None


def test_it_turns_503_naming_the_channel_layer_when_redis_is_unreachable(settings):
    call_command("run_scheduler", "--once", stdout=io.StringIO())
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]},
        }
    }
    status, body = _health()
    assert status == 503
    assert body["channel_layer"] == "unreachable"
    assert body["database"] == body["scheduler"] == "ok"


def test_phase_timings_accumulate_across_cycles():
    for _ in range(3):
        call_command("run_scheduler", "--once", stdout=io.StringIO())
    row = SchedulerHeartbeat.objects.get()
    assert row.cycles == 3
    assert {"load", "core", "commit", "lifecycle", "total"} <= set(row.phase_histograms)
    total = row.phase_histograms["total"]
    assert total["count"] == 3 and sum(total["buckets"]) == 3
