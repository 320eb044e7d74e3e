"""Warnings N minutes before the walltime (`time_limit_10m`, `time_limit_1m`): asked for like
any event, and sent by default for a job with a web app (an interactive job) when neither it
nor its owner chose events (docs/notifications.md, docs/interactive.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.jobs.submit import submit_job
from scheduler.models import Job, NotifyPreference, Outbox
from scheduler.outbox import enqueue_time_limits
from scheduler.states.names import JobState

pytestmark = pytest.mark.django_db


def spec(walltime: int, **fields: Any) -> dict[str, Any]:
    return {"name": "nb", "walltime": walltime, **fields,
            "tasks": [{"name": "main", "command": "true",
                       "resources": {"cpu": "1", "memory": "1Gi"}}]}  # fmt: skip


def run_for(job: Job, seconds: float) -> None:
    started = timezone.now() - timedelta(seconds=seconds)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, started_at=started)


@pytest.fixture
def owner_with_mail(owner: Any) -> Any:
    owner.email = "alice@example.org"
    owner.save()
    return owner


def test_a_job_with_an_app_is_warned_ten_and_one_minute_before_its_end(owner_with_mail):
    job = submit_job(owner_with_mail, spec(3600, apps="jupyter"))
    run_for(job, 3600 - 700)
    assert enqueue_time_limits() == 0
    run_for(job, 3600 - 590)
    assert enqueue_time_limits() == 1
    assert enqueue_time_limits() == 0  # once
    run_for(job, 3600 - 50)
    assert enqueue_time_limits() == 1
    texts = dict(Outbox.objects.values_list("kind", "text"))
    assert set(texts) == {"time_limit_10m", "time_limit_1m"}
    assert "has 10 min left of its walltime (3600 s)" in texts["time_limit_10m"]
    assert f"berth extend {job.pk} --by 30m" in texts["time_limit_1m"]


def test_a_batch_job_is_warned_only_when_asked(owner_with_mail):
    batch = submit_job(owner_with_mail, spec(3600))
    asked = submit_job(owner_with_mail, spec(3600, notify={"events": ["time_limit_1m"]}))
    quiet_app = submit_job(owner_with_mail, spec(3600, apps="http", notify={"events": ["end"]}))
    for job in (batch, asked, quiet_app):
        run_for(job, 3590)
    assert enqueue_time_limits() == 1
    assert list(Outbox.objects.values_list("job_id", "kind")) == [(asked.pk, "time_limit_1m")]


def test_the_owners_defaults_win_over_the_interactive_ones(owner_with_mail):
    NotifyPreference.objects.create(user=owner_with_mail, events="time_limit_90")
    job = submit_job(owner_with_mail, spec(3600, apps="jupyter"))
    run_for(job, 3590)
    assert enqueue_time_limits() == 1
    assert list(Outbox.objects.values_list("kind", flat=True)) == ["time_limit_90"]


def test_a_job_shorter_than_the_warning_is_not_warned(owner_with_mail):
    job = submit_job(owner_with_mail, spec(45, apps="jupyter"))
    run_for(job, 1)
    assert enqueue_time_limits() == 0
    job_10 = submit_job(owner_with_mail, spec(300, apps="jupyter"))
    run_for(job_10, 250)
    assert list(Outbox.objects.filter(job=job_10).values_list("kind", flat=True)) == []
    assert enqueue_time_limits() == 1  # the 1-minute warning only: it never had 10
    assert list(Outbox.objects.values_list("kind", flat=True)) == ["time_limit_1m"]
