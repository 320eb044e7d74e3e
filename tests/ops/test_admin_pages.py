"""The admin console lists API tokens (staff may revoke them) and the read-only usage trail."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from scheduler.models import ApiToken, UsageRecord
from scheduler.ops.tokens import create_token

pytestmark = pytest.mark.django_db


def test_staff_list_and_revoke_tokens_and_read_usage(staff, owner):
    token, key = create_token(owner, "laptop")
    now = timezone.now()
    UsageRecord.objects.create(
        user=owner,
        username="alice",
        queue="default",
        job_id=1,
        task_id=1,
        state="Succeeded",
        started_at=now,
        finished_at=now,
        day=now.date(),
        wall_seconds=1,
        cpu_seconds=1,
        gpu_seconds=0,
    )
    console = Client()
    console.force_login(staff)
    listing = console.get("/admin/scheduler/apitoken/").content.decode()
    assert "laptop" in listing and token.prefix in listing and key not in listing
    assert console.get("/admin/scheduler/apitoken/add/").status_code == 403
    assert console.get("/admin/scheduler/usagerecord/").status_code == 200
    assert console.post(f"/admin/scheduler/usagerecord/{UsageRecord.objects.get().pk}/delete/",
                        {"post": "yes"}).status_code == 403  # fmt: skip
    response = console.post(f"/admin/scheduler/apitoken/{token.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not ApiToken.objects.exists()
