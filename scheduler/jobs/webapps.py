"""A job's web app (spec `apps`, docs/interactive.md): where the app proxy
(berth/web/appproxy.py) may connect for it, and the secret it presents to the app.

The target is only ever the registered address of the node running the job's app task and
the port that task's agent reported; nothing a request says can name another host or port.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from scheduler.intake.specs import job_app
from scheduler.models import Job, Task
from scheduler.states.names import JobState, TaskState

# What the user does through the proxy is the app's use (an interactive GPU job in use is not
# idle: scheduler/lifecycle/idle_sessions.py): the proxy (berth/web/appproxy.py) writes it on
# the job at most this often per process, the idle limits counting in minutes.
USE_MARK_SECONDS = 30.0
_marked: dict[int, float] = {}  # job -> when this process last wrote its use (monotonic)
_marked_lock = threading.Lock()
_MARKED_MAX = 10_000  # jobs remembered; past that the oldest are forgotten (and written again)


def app_use_due(job_id: int) -> bool:
    """Whether a request for the app of `job_id` should be written as its use now (cheap,
    in memory: a relay asks for every message); claims the mark when it says yes."""
    now = time.monotonic()
    with _marked_lock:
        last = _marked.get(job_id)
        if last is not None and now - last < USE_MARK_SECONDS:
            return False
        if len(_marked) >= _MARKED_MAX:
            for old in sorted(_marked, key=_marked.__getitem__)[: _MARKED_MAX // 2]:
                del _marked[old]
        _marked[job_id] = now
        return True


def mark_app_used(job_id: int) -> None:
    """Write that the app of `job_id` was used just now (after `app_use_due` said so)."""
    Job.objects.filter(pk=job_id).update(app_used_at=timezone.now())


def app_prefix(job_id: int) -> str:
    """Where users reach a job's app: /apps/<job>/ ($BERTH_APP_BASE_URL for jupyter)."""
    return f"/apps/{job_id}/"


def app_token(task_id: int, attempt: int) -> str:
    """The secret the proxy presents to the app of this attempt ($BERTH_APP_TOKEN): derived
    from the server's key, so nothing is stored, and new for every attempt."""
    key = settings.SECRET_KEY.encode()
    message = f"berth-app:{task_id}:{attempt}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def app_env(job_id: int, kind: str, task_id: int, attempt: int, host: str) -> dict[str, str]:
    """What the task running a job's app is told, besides the port its agent picks."""
    env = {
        "BERTH_APP": kind,
        "BERTH_APP_HOST": host,
        "BERTH_APP_TOKEN": app_token(task_id, attempt),
    }
    if kind == "jupyter":
        env["BERTH_APP_BASE_URL"] = app_prefix(job_id)
    return env


@dataclass(frozen=True)
class AppTarget:
    """A job's app as the proxy sees it; `host`/`port` are None until the app task runs."""

    job_id: int
    kind: str
    host: str | None
    port: int | None
    token: str


def find_app(user_id: int, job_id: int) -> AppTarget | None:
    """The app of job `job_id` if `user_id` owns it and it declares one (else None: a 404,
    whether the job exists or not). Staff get no one else's app: an app acts as its owner."""
    job = Job.objects.filter(pk=job_id, owner_id=user_id).only("spec", "state").first()
    if job is None or not (kind := job_app(job.spec)):
        return None
    task = (
        Task.objects.filter(job=job, state=TaskState.RUNNING, app_port__isnull=False)
        .select_related("node")
        .only("attempt", "app_port", "node__address")
        .first()
    )
    if job.state != JobState.RUNNING or task is None or task.node is None or not task.node.address:
        return AppTarget(job_id, kind, None, None, "")
    return AppTarget(job_id, kind, task.node.address, task.app_port,
                     app_token(task.pk, task.attempt))  # fmt: skip
