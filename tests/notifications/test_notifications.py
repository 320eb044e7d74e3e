"""Job notifications (issue #24): written to the outbox with the state change, delivered at
least once by the notifier by email (a real local SMTP server) and signed webhooks (a local
receiver), retried with capped backoff, throttled per user, only to allowed hosts."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from scheduler.jobs.submit import submit_job
from scheduler.lifecycle.moves import move_job
from scheduler.models import Event, Job, NotifyPreference, Outbox
from scheduler.notifications import delivery
from scheduler.outbox import enqueue_time_limits
from scheduler.states.job import JobEvent
from scheduler.states.names import JobState
from tests.factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def allowed(settings: Any) -> None:
    settings.BERTH_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1:*"]  # the receiver's port is random
    settings.BERTH_NOTIFY_RETRY_BASE = 10.0
    settings.BERTH_NOTIFY_RETRY_CAP = 40.0


def job_spec(**notify: Any) -> dict[str, Any]:
    return {"name": "train", "walltime": 100, "notify": notify,
            "tasks": [{"name": "main", "command": "true",
                       "resources": {"cpu": "1", "memory": "1Gi"}}]}  # fmt: skip


def start(job: Job) -> None:
    with transaction.atomic():
        move_job(job, JobEvent.START, "1 of 1 tasks running", timezone.now())
        job.save()


def end(job: Job, event: JobEvent = JobEvent.FAIL) -> None:
    with transaction.atomic():
        move_job(job, event, "task main-0 exited 3", timezone.now(), "TaskFailed")
        job.save()


def verify(receiver_request: dict[str, Any], secret: str) -> dict[str, Any]:
    headers = {k.lower(): v for k, v in receiver_request["headers"].items()}
    body = receiver_request["body"]
    mac = hmac.new(secret.encode(), headers["x-berth-timestamp"].encode() + b"." + body,
                   hashlib.sha256)  # fmt: skip
    assert hmac.compare_digest(headers["x-berth-signature"], f"sha256={mac.hexdigest()}")
    return dict(json.loads(body))


# --- submission ------------------------------------------------------------------------


def test_it_refuses_a_disallowed_webhook_host_at_submission_and_never_calls_it(
    api, owner, receiver, settings
):
    settings.BERTH_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.org"]
    body = job_spec(events=["end"], webhook=receiver.url)
    response = api(owner).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert "not allowed" in response.json()["notify.webhook"][0]
    assert Job.objects.count() == 0
    account = api(owner).patch("/api/v1/me/notifications/", {"webhook_url": receiver.url},
                               format="json")  # fmt: skip
    assert account.status_code == 400 and "webhook_url" in account.json()
    delivery.run_once()
    assert receiver.requests == []


@pytest.mark.parametrize(
    ("notify", "field"),
    [({"events": ["begin", "lunch"]}, "notify.events"), ({"events": "x" * 5000}, "notify.events"),
     ({"events": ["end"] * 100}, "notify.events"), ({"events": [], "sms": 1}, "notify.sms"),
     ({"events": [], "webhook": "ftp://127.0.0.1/"}, "notify.webhook"),
     ({"events": [], "webhook": "http://u:p@127.0.0.1/"}, "notify.webhook"),
     ({"events": [], "email": "yes"}, "notify.email")],
)  # fmt: skip
def test_a_bad_notify_is_a_400_naming_the_field(api, owner, notify, field):
    response = api(owner).post("/api/v1/jobs/", job_spec(**notify), format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()


def test_notify_is_kept_in_canonical_form(api, owner, receiver):
    body = {**job_spec(), "notify": "end, begin"}
    response = api(owner).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["spec"]["notify"] == {"events": ["begin", "end"]}


# --- the outbox ------------------------------------------------------------------------


def test_a_state_change_writes_the_outbox_in_its_transaction(owner):
    owner.email = "alice@example.org"
    owner.save()
    job = submit_job(owner, job_spec(events=["begin", "fail"]))
    start(job)
    assert list(Outbox.objects.values_list("kind", "channel", "target")) == [
        ("begin", "email", "alice@example.org")
    ]
    with pytest.raises(RuntimeError), transaction.atomic():
        end(job)
        raise RuntimeError("rolled back")
    assert Outbox.objects.count() == 1  # nothing for a change that never happened
    job.refresh_from_db()
    end(job)
    failed = Outbox.objects.get(kind="fail")
    assert "task main-0 exited 3" in failed.text and failed.payload["state"] == "Failed"


def test_the_users_defaults_apply_to_jobs_that_do_not_say(owner, receiver):
    NotifyPreference.objects.create(user=owner, events="end", email=False,
                                    webhook_url=receiver.url)  # fmt: skip
    plain = make_job(owner)
    silenced = submit_job(owner, {**job_spec(), "notify": []})
    for job in (plain, silenced):
        Event.objects.bulk_create(
            [
                Event(
                    kind="JobStateChanged",
                    job_id=job.pk,
                    message="Running -> Succeeded: all 1 tasks succeeded",
                )
            ]
        )
    rows = list(Outbox.objects.values_list("job_id", "kind", "channel"))
    assert rows == [(plain.pk, "end", "webhook")]


def test_array_elements_are_not_notified_one_by_one(owner):
    owner.email = "alice@example.org"
    owner.save()
    parent = submit_job(owner, {**job_spec(events=["end"]), "array": "0-2"})
    element = Job.objects.filter(array_parent=parent).earliest("id")
    Event.objects.bulk_create([Event(kind="JobStateChanged", job_id=element.pk,
                                     message="Running -> Succeeded: done")])  # fmt: skip
    assert Outbox.objects.count() == 0


def test_time_limit_warnings_fire_once_each(owner):
    owner.email = "alice@example.org"
    owner.save()
    job = submit_job(owner, job_spec(events=["time_limit_80", "time_limit_90"]))
    start(job)
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(started_at=now - timedelta(seconds=70))
    assert enqueue_time_limits(now) == 0
    Job.objects.filter(pk=job.pk).update(started_at=now - timedelta(seconds=85))
    assert enqueue_time_limits(now) == 1
    assert enqueue_time_limits(now) == 0
    Job.objects.filter(pk=job.pk).update(started_at=now - timedelta(seconds=95))
    assert enqueue_time_limits(now) == 1
    assert sorted(Outbox.objects.values_list("kind", flat=True)) == [
        "time_limit_80", "time_limit_90"]  # fmt: skip
    assert "80 % of its walltime" in Outbox.objects.get(kind="time_limit_80").text


def test_time_limit_warnings_follow_the_users_defaults_unless_the_job_says(owner):
    owner.email = "alice@example.org"
    owner.save()
    NotifyPreference.objects.create(user=owner, events="time_limit_50")
    plain = make_job(owner, walltime=100)
    other = submit_job(owner, job_spec(events=["end"]))
    now = timezone.now()
    Job.objects.update(state=JobState.RUNNING, started_at=now - timedelta(seconds=60))
    assert enqueue_time_limits(now) == 1
    assert list(Outbox.objects.values_list("job_id", "kind")) == [(plain.pk, "time_limit_50")]
    assert other.pk != plain.pk


# --- delivery --------------------------------------------------------------------------


def test_email_reaches_a_real_smtp_server(owner, smtp):
    owner.email = "alice@example.org"
    owner.save()
    job = submit_job(owner, job_spec(events=["begin"]))
    start(job)
    assert delivery.run_once() == 1
    [(to, message)] = smtp.messages
    assert to == ["alice@example.org"]
    assert f"job {job.pk} (train) started" in message["Subject"]
    assert Outbox.objects.get().delivered_at is not None
    assert delivery.run_once() == 0  # delivered once


def test_a_webhook_arrives_signed_with_the_users_secret(owner, receiver):
    job = submit_job(owner, job_spec(events=["end"], webhook=receiver.url, email=False))
    start(job)
    end(job, JobEvent.SUCCEED)
    assert delivery.run_once() == 1
    [request] = receiver.requests
    secret = NotifyPreference.objects.get(user=owner).webhook_secret
    body = verify(request, secret)
    assert body["text"].startswith(f"Berth: job {job.pk} (train) ended (Succeeded)")
    assert body["event"] == "end" and body["job"] == job.pk
    assert body["delivery"] == int(request["headers"]["X-Berth-Delivery"])


def test_failures_are_retried_with_capped_backoff_and_redirects_are_not_followed(
    owner, receiver, settings
):
    settings.BERTH_NOTIFY_MAX_ATTEMPTS = 5
    receiver.statuses = [500, 302, 503, 500, 200]
    job = submit_job(owner, job_spec(events=["begin"], webhook=receiver.url))
    start(job)
    now = timezone.now()
    waits = []
    for _ in range(5):
        assert delivery.run_once(now) == 1
        row = Outbox.objects.get()
        waits.append((row.next_attempt_at - now).total_seconds())
        assert delivery.run_once(now) == 0  # not due again before its backoff
        now = row.next_attempt_at
    row = Outbox.objects.get()
    assert row.delivered_at is not None and row.attempts == 5
    assert [round(w) for w in waits[:4]] == [10, 20, 40, 40]  # doubling, capped at 40
    assert len(receiver.requests) == 5
    assert all(r["path"] == "/" for r in receiver.requests)  # the redirect was not followed


def test_it_gives_up_after_the_last_attempt(owner, receiver, settings):
    settings.BERTH_NOTIFY_MAX_ATTEMPTS = 2
    receiver.statuses = [500, 500, 500]
    job = submit_job(owner, job_spec(events=["begin"], webhook=receiver.url))
    start(job)
    now = timezone.now()
    delivery.run_once(now)
    delivery.run_once(now + timedelta(hours=1))
    row = Outbox.objects.get()
    assert row.gave_up_at is not None and "HTTP 500" in row.last_error
    assert delivery.run_once(now + timedelta(hours=2)) == 0 and len(receiver.requests) == 2


def test_a_host_no_longer_allowed_is_never_called(owner, receiver, settings):
    job = submit_job(owner, job_spec(events=["begin"], webhook=receiver.url))
    start(job)
    settings.BERTH_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.org"]
    delivery.run_once()
    assert receiver.requests == []
    assert "not allowed" in Outbox.objects.get().last_error


def test_each_user_is_throttled_and_nothing_is_dropped(owner, teammate, receiver, settings):
    settings.BERTH_NOTIFY_USER_PER_MINUTE = 2
    for user in (owner, teammate):
        for _ in range(4):
            start(submit_job(user, job_spec(events=["begin"], webhook=receiver.url)))
    now = timezone.now()
    assert delivery.run_once(now) == 4  # two each
    users = [json.loads(r["body"])["job"] for r in receiver.requests]
    assert len(users) == 4
    assert Outbox.objects.filter(delivered_at__isnull=True).count() == 4
    assert delivery.run_once(now) == 0  # still inside the minute
    assert delivery.run_once(now + timedelta(seconds=61)) == 4
    assert not Outbox.objects.filter(delivered_at__isnull=True).exists()


def test_the_account_endpoint_keeps_the_defaults(api, owner, receiver):
    client = api(owner)
    first = client.get("/api/v1/me/notifications/").json()
    assert first["events"] == [] and first["email"] is True and len(first["webhook_secret"]) == 64
    changed = client.patch(
        "/api/v1/me/notifications/",
        {"events": "fail,begin", "webhook_url": receiver.url, "rotate_secret": True},
        format="json",
    )
    assert changed.status_code == 200, changed.json()
    assert changed.json()["events"] == ["begin", "fail"]
    assert changed.json()["webhook_secret"] != first["webhook_secret"]
    bad = client.patch("/api/v1/me/notifications/", {"events": ["soon"]}, format="json")
    assert bad.status_code == 400 and "events" in bad.json()


def test_settled_rows_are_pruned_after_a_week_but_a_running_jobs_warnings_stay(owner):
    owner.email = "alice@example.org"
    owner.save()
    job = submit_job(owner, job_spec(events=["begin", "time_limit_50"]))
    start(job)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=60))
    enqueue_time_limits()
    old = timezone.now() - timedelta(days=8)
    Outbox.objects.update(delivered_at=old)
    assert delivery.prune(timezone.now()) == 1  # the begin; the warning of a running job stays
    assert list(Outbox.objects.values_list("kind", flat=True)) == ["time_limit_50"]
    assert enqueue_time_limits() == 0  # and so it does not fire again
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    assert delivery.prune(timezone.now()) == 1


def test_a_row_another_notifier_took_after_the_lease_passed_is_not_sent_again(owner, receiver):
    job = submit_job(owner, job_spec(events=["begin"], webhook=receiver.url))
    start(job)
    now = timezone.now()
    [mine] = delivery.claim(now)
    later = now + timedelta(hours=1)  # this notifier stalled past its lease...
    [theirs] = delivery.claim(later)  # ...and another one claimed the row
    assert not delivery.renew(mine, later)
    assert delivery.renew(theirs, later)


def test_an_email_subject_is_one_line(owner, smtp):
    owner.email = "alice@example.org"
    owner.save()
    job = submit_job(owner, job_spec(events=["fail"]))
    start(job)
    with transaction.atomic():
        move_job(job, JobEvent.FAIL, "task main-0 said:\nboom\r\nagain", timezone.now(),
                 "TaskFailed")  # fmt: skip
        job.save()
    assert delivery.run_once() == 1
    [(_, message)] = smtp.messages
    assert "\n" not in message["Subject"] and "boom again" in message["Subject"]
    assert Outbox.objects.get().delivered_at is not None


# --- hostile input and fairness between users (review of the notifier) ---------------------


@pytest.mark.parametrize(
    ("url", "allowed_hosts", "problem"),
    [
        ("https://hooks.example.org/\u0001", ["hooks.example.org"], "printable ASCII"),
        ("https://hooks.example.org/a\tb", ["hooks.example.org"], "printable ASCII"),
        ("https://xn--.example.org/", [".example.org"], "not a valid URL"),
        ("https://\u2603.example.org/", [".example.org"], "printable ASCII"),
        ("https://hooks.example.org:22/", ["hooks.example.org"], "not allowed"),
        ("https://hooks.example.org:8443/x", ["hooks.example.org:8443"], None),
        ("https://hooks.example.org:443/x", ["hooks.example.org"], None),
        ("http://hooks.example.org:9000/x", ["hooks.example.org:*"], None),
        ("https://hooks.example.org@evil.example/", ["hooks.example.org"], "credentials"),
    ],
)
def test_webhook_urls_the_http_client_would_read_otherwise_are_refused(
    settings, url, allowed_hosts, problem
):
    from scheduler.intake.specs import webhook_url_problem

    settings.BERTH_WEBHOOK_ALLOWED_HOSTS = allowed_hosts
    found = webhook_url_problem(url)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_a_poisoned_url_stored_before_the_check_is_given_up_and_never_stops_the_pass(
    owner, teammate, smtp
):
    teammate.email = "bob@example.org"
    teammate.save()
    bad = make_job(owner)
    Outbox.objects.create(user=owner, job=bad, job_ref=str(bad.pk), kind="end",
                          channel="webhook", target="https://127.0.0.1/\u0001", text="x",
                          next_attempt_at=timezone.now() - timedelta(seconds=1))  # fmt: skip
    start(submit_job(teammate, job_spec(events=["begin"])))
    assert delivery.run_once() == 2
    assert len(smtp.messages) == 1  # bob's email went out beside the poisoned row
    poisoned = Outbox.objects.get(channel="webhook")
    assert poisoned.gave_up_at is not None and "printable ASCII" in poisoned.last_error


def test_an_unexpected_error_on_one_row_is_a_failed_try_not_a_dead_notifier(
    owner, teammate, smtp, monkeypatch
):
    teammate.email = "bob@example.org"
    teammate.save()
    owner.email = "alice@example.org"
    owner.save()
    start(submit_job(owner, job_spec(events=["begin"])))
    start(submit_job(teammate, job_spec(events=["begin"])))
    real = delivery.send

    def send(row: Outbox) -> None:
        if row.target == "alice@example.org":
            raise RuntimeError("a bug in one row")
        real(row)

    monkeypatch.setattr(delivery, "send", send)
    assert delivery.run_once() == 2
    assert [to for to, _ in smtp.messages] == [["bob@example.org"]]
    alice = Outbox.objects.get(target="alice@example.org")
    assert alice.delivered_at is None and alice.attempts == 1 and "a bug" in alice.last_error


def test_one_users_backlog_never_delays_another_users_notifications(
    owner, teammate, receiver, settings
):
    settings.BERTH_NOTIFY_USER_PER_MINUTE = 5
    past = timezone.now() - timedelta(seconds=5)
    job = make_job(owner)
    Outbox.objects.bulk_create(
        Outbox(user=owner, job=job, job_ref=str(job.pk), kind="end", channel="webhook",
               target=receiver.url, text=f"alice {i}", next_attempt_at=past)
        for i in range(300)
    )  # fmt: skip
    start(submit_job(teammate, job_spec(events=["begin"], webhook=receiver.url)))
    now = timezone.now()
    delivery.run_once(now)  # alice's first five
    delivery.run_once(now)  # alice is left out of the claim: bob's row is next
    texts = [json.loads(r["body"])["text"] for r in receiver.requests]
    assert len(texts) == 6 and "started" in texts[-1]


def test_failed_tries_count_against_the_throttle(owner, receiver, settings):
    settings.BERTH_NOTIFY_USER_PER_MINUTE = 3
    receiver.statuses = [500] * 20
    for _ in range(6):
        start(submit_job(owner, job_spec(events=["begin"], webhook=receiver.url)))
    now = timezone.now()
    for step in range(4):  # past each row's backoff, still inside the minute
        delivery.run_once(now + timedelta(seconds=step * 12))
    assert len(receiver.requests) == 3


def test_a_late_settle_leaves_the_row_to_the_notifier_that_took_it(owner, receiver):
    job = submit_job(owner, job_spec(events=["begin"], webhook=receiver.url))
    start(job)
    now = timezone.now()
    [mine] = delivery.claim(now)
    later = now + timedelta(hours=1)
    [theirs] = delivery.claim(later)
    delivery.settle(mine, delivery.Undeliverable("slow"), later)  # the stalled one gives up
    row = Outbox.objects.get()
    assert (row.attempts, row.next_attempt_at, row.last_error) == (0, theirs.next_attempt_at, "")


def test_a_jobs_own_email_true_wins_over_the_accounts_off(owner, smtp):
    owner.email = "alice@example.org"
    owner.save()
    NotifyPreference.objects.create(user=owner, events="begin", email=False)
    start(submit_job(owner, job_spec(events=["begin"], email=True)))
    start(submit_job(owner, job_spec(events=["begin"])))
    assert Outbox.objects.filter(channel="email").count() == 1


def test_the_loop_waits_out_a_database_outage(monkeypatch):
    import threading

    from django.db import OperationalError

    stop, calls = threading.Event(), []

    def flaky(**kwargs: Any) -> int:
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("connection refused") from ConnectionRefusedError()
        stop.set()
        return 0

    monkeypatch.setattr(delivery, "run_once", flaky)
    monkeypatch.setattr(delivery, "prune", lambda now: 0)
    delivery.run_loop(stop, interval=0.01)  # returns: it did not die of the outage
    assert len(calls) == 3
