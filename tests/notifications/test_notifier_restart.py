"""`run_notifier` as a real process, killed (SIGKILL) in the middle of its work and started
again: every notification arrives, none is lost, and only the one being sent at the kill can
come twice (receivers dedupe on X-Berth-Delivery); the database holds each delivered once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from django.utils import timezone

from scheduler.models import Outbox
from tests.e2e.conftest import database_url, wait_for

ROOT = Path(__file__).resolve().parents[2]
COUNT = 8


def notifier(tmp: Path, name: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": database_url(),
           "BERTH_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1:*",
           "BERTH_NOTIFY_LEASE": "2", "BERTH_NOTIFY_INTERVAL": "0.1"}  # fmt: skip
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "run_notifier"], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def test_each_notification_arrives_across_a_killed_notifier(
    transactional_db: None, owner: Any, receiver: Any, tmp_path: Path
):
    receiver.delay = 0.4  # a slow receiver: the kill lands while some are still to send
    Outbox.objects.bulk_create(
        Outbox(user=owner, job_ref=str(i), kind="end", channel="webhook", target=receiver.url,
               text=f"Berth: job {i} ended", payload={"job": i}, next_attempt_at=timezone.now())
        for i in range(COUNT)
    )  # fmt: skip
    first = notifier(tmp_path, "first")
    try:
        wait_for(lambda: len(receiver.requests) >= 3, timeout=60, what="a few deliveries")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        assert Outbox.objects.filter(delivered_at__isnull=True).exists()  # killed mid-run
        second = notifier(tmp_path, "second")
        try:
            wait_for(lambda: not Outbox.objects.filter(delivered_at__isnull=True).exists(),
                     timeout=60, what="every row delivered")  # fmt: skip
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(20)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    ids = set(Outbox.objects.values_list("pk", flat=True))
    seen = Counter(int(r["headers"]["X-Berth-Delivery"]) for r in receiver.requests)
    assert set(seen) == ids  # none lost
    assert sum(seen.values()) <= COUNT + 1  # at most the one in flight at the kill, twice
    assert Outbox.objects.filter(attempts=1).count() == COUNT
