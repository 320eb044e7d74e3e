"""The notifier: delivers the outbox (scheduler/outbox.py) at least once.

One pass (`run_once`): queue the time-limit warnings now due, claim the due rows, send each,
settle each. Claiming (`claim`) locks due rows with SELECT … FOR UPDATE SKIP LOCKED (several
notifiers never take the same row) and moves their `next_attempt_at` a lease ahead before
committing, so a notifier that dies while sending leaves its rows to be claimed again when
the lease passes: a notification may come twice (receivers dedupe on `X-Berth-Delivery`),
never not at all. A failed send is tried again after a capped exponential backoff
(BERTH_NOTIFY_RETRY_BASE doubling up to BERTH_NOTIFY_RETRY_CAP) until
BERTH_NOTIFY_MAX_ATTEMPTS, then given up (kept, with its last error). A user whose
notifications were tried BERTH_NOTIFY_USER_PER_MINUTE times in the last minute (failures
count) waits, and only they do: their due rows stay due, and others' rows are claimed first.

Webhooks: a JSON body with a Slack-compatible `text`, signed with the user's secret
(`X-Berth-Signature: sha256=HMAC-SHA256(secret, "<X-Berth-Timestamp>.<body>")`), only to
hosts BERTH_WEBHOOK_ALLOWED_HOSTS allows (checked again here: staff may have removed one),
redirects not followed, within BERTH_WEBHOOK_TIMEOUT."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections import Counter
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.core.mail import send_mail
from django.db import close_old_connections, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from scheduler.intake.specs import webhook_url_problem
from scheduler.models import NotifyPreference, Outbox
from scheduler.ops.faults import Outage, dependency_down
from scheduler.outbox import enqueue_time_limits
from scheduler.states.names import JOB_FINAL

log = logging.getLogger("berth.notifier")
BATCH = 50
THROTTLE_WINDOW = timedelta(seconds=60)
KEEP = timedelta(days=7)  # delivered and given-up rows are kept this long (admin, debugging)
PRUNE_EVERY = 3600.0  # seconds between prunes in one notifier
TIME_LIMIT_EVERY = 5.0  # seconds between scans for time-limit warnings in one notifier


class Undeliverable(Exception):
    """Sending failed; `final` when trying again cannot help (a host no longer allowed)."""

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


def claim(now: datetime, limit: int = BATCH) -> list[Outbox]:
    """Lock and lease the due rows this pass sends, oldest first. A user who was sent
    BERTH_NOTIFY_USER_PER_MINUTE attempts (failed ones too) in the last minute is left out
    of the query itself, so their backlog never stands in front of anyone else's rows."""
    lease = now + timedelta(seconds=settings.BERTH_NOTIFY_LEASE)
    per_minute = settings.BERTH_NOTIFY_USER_PER_MINUTE
    with transaction.atomic():
        tried = Counter(
            dict(
                Outbox.objects.filter(last_attempt_at__gte=now - THROTTLE_WINDOW)
                .values_list("user_id")
                .annotate(n=Count("id"))
                .order_by()
            )
        )
        throttled = [user for user, n in tried.items() if n >= per_minute]
        due = list(
            Outbox.objects.select_for_update(skip_locked=True)
            .filter(delivered_at__isnull=True, gave_up_at__isnull=True, next_attempt_at__lte=now)
            .exclude(user_id__in=throttled)
            .order_by("next_attempt_at", "id")[:limit]
        )
        claimed = []
        for row in due:  # rows past a user's room stay due, for a later pass
            if tried[row.user_id] < per_minute:
                tried[row.user_id] += 1
                claimed.append(row)
        Outbox.objects.filter(pk__in=[r.pk for r in claimed]).update(
            next_attempt_at=lease, last_attempt_at=now
        )
    for row in claimed:
        row.next_attempt_at = lease  # the lease this notifier holds: see `renew`
    return claimed


def renew(row: Outbox, now: datetime) -> bool:
    """Just before sending: move the row's lease to start now, if this notifier still holds
    it (its lease unchanged). A batch of slow sends can outlast the lease it was claimed
    with; a row whose lease passed and that another notifier took is not sent twice."""
    lease = now + timedelta(seconds=settings.BERTH_NOTIFY_LEASE)
    held = Outbox.objects.filter(pk=row.pk, next_attempt_at=row.next_attempt_at,
                                 delivered_at__isnull=True, gave_up_at__isnull=True)  # fmt: skip
    if not held.update(next_attempt_at=lease):
        return False
    row.next_attempt_at = lease
    return True


def send(row: Outbox) -> None:
    """Deliver one row; Undeliverable when it did not go."""
    if row.channel == "email":
        # One line: a job's message may hold newlines, which a header may not.
        subject = " ".join(row.text.removeprefix("Berth: ").split())[:150]
        try:
            send_mail(f"[Berth] {subject}", row.text, None, [row.target])
        except Exception as exc:  # SMTP, socket and header errors alike: try again later
            raise Undeliverable(f"email: {exc}") from None
        return
    _post_webhook(row)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def _post_webhook(row: Outbox) -> None:
    problem = webhook_url_problem(row.target)
    if problem:
        raise Undeliverable(f"webhook URL {problem}", final=True)
    secret = NotifyPreference.objects.get_or_create(user_id=row.user_id)[0].webhook_secret
    body = json.dumps({**row.payload, "text": row.text, "delivery": row.pk}).encode()
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "User-Agent": "berth-notifier",
               "X-Berth-Delivery": str(row.pk), "X-Berth-Timestamp": timestamp,
               "X-Berth-Signature": signature(secret, timestamp, body)}  # fmt: skip
    try:
        response = httpx.post(row.target, content=body, headers=headers, follow_redirects=False,
                              timeout=settings.BERTH_WEBHOOK_TIMEOUT)  # fmt: skip
    except httpx.InvalidURL as exc:  # (not an HTTPError) no later try can send it
        raise Undeliverable(f"webhook URL refused by the client: {exc}", final=True) from None
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: httpx's IDNA errors, too
        raise Undeliverable(f"webhook: {type(exc).__name__}: {exc}") from None
    if not 200 <= response.status_code < 300:  # a redirect too: never followed
        raise Undeliverable(f"webhook: HTTP {response.status_code}")


def settle(row: Outbox, error: Undeliverable | None, now: datetime) -> None:
    """Mark a sent row delivered, or schedule its next try (or give up), while this notifier
    still holds its lease: a send that outlasted the lease leaves the row to whoever took it."""
    rows = Outbox.objects.filter(
        pk=row.pk, next_attempt_at=row.next_attempt_at, delivered_at__isnull=True
    )
    if error is None:
        rows.update(delivered_at=now, attempts=F("attempts") + 1, last_error="")
        return
    attempts = row.attempts + 1
    if error.final or attempts >= settings.BERTH_NOTIFY_MAX_ATTEMPTS:
        rows.update(gave_up_at=now, attempts=F("attempts") + 1, last_error=str(error)[:2000])
        log.warning("notification %s given up after %d attempts: %s", row.pk, attempts, error)
        return
    wait = backoff(attempts)
    rows.update(next_attempt_at=now + timedelta(seconds=wait), attempts=F("attempts") + 1,
                last_error=str(error)[:2000])  # fmt: skip


def backoff(attempts: int) -> float:
    """Seconds before try `attempts + 1`: the base doubling per failure, capped."""
    base, cap = settings.BERTH_NOTIFY_RETRY_BASE, settings.BERTH_NOTIFY_RETRY_CAP
    return float(min(cap, base * 2 ** min(attempts - 1, 40)))


def run_once(now: datetime | None = None, *, time_limits: bool = True) -> int:
    """One pass; returns how many rows it claimed. `now` (tests) fixes the clock."""
    if time_limits:
        enqueue_time_limits(now)
    rows = claim(now or timezone.now())
    for row in rows:
        if not renew(row, now or timezone.now()):
            continue
        try:
            send(row)
            error = None
        except Undeliverable as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - one row never stops the others
            log.exception("notification %s: unexpected error while sending", row.pk)
            error = Undeliverable(f"{type(exc).__name__}: {exc}")
        settle(row, error, now or timezone.now())
    return len(rows)


def prune(now: datetime) -> int:
    """Delete rows settled more than KEEP ago, except the time-limit warnings of jobs still
    active (their rows are what makes each warning fire once)."""
    settled = Outbox.objects.filter(Q(delivered_at__lt=now - KEEP) | Q(gave_up_at__lt=now - KEEP))
    ended = Q(job__isnull=True) | Q(job__state__in=JOB_FINAL) | ~Q(kind__startswith="time_limit_")
    return int(settled.filter(ended).delete()[0])


def run_loop(stop: threading.Event, interval: float | None = None) -> None:
    """Passes until `stop` is set; idle passes wait `interval` (BERTH_NOTIFY_INTERVAL). The
    database down (a restart, a lost network) is waited out with backoff and logged once per
    outage (scheduler/ops/faults.py); anything else is logged and the next pass tried."""
    interval = settings.BERTH_NOTIFY_INTERVAL if interval is None else interval
    pruned = scanned = 0.0
    outage = Outage("database", log)
    while not stop.is_set():
        try:
            if time.monotonic() - pruned > PRUNE_EVERY:
                prune(timezone.now())
                pruned = time.monotonic()
            # Running jobs are read for their walltime at most every TIME_LIMIT_EVERY seconds.
            scan = time.monotonic() - scanned > TIME_LIMIT_EVERY
            scanned = time.monotonic() if scan else scanned
            busy = run_once(time_limits=scan)
            outage.recovered()
        except Exception as exc:  # noqa: BLE001 - the notifier outlives any one pass
            if dependency_down(exc):
                stop.wait(outage.failed(exc))
            else:
                log.exception("notifier pass failed; trying again")
                stop.wait(interval)
            continue
        finally:
            close_old_connections()
        if not busy:
            stop.wait(interval)
