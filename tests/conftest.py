"""Shared fixtures: the users every ownership test needs, API clients, and the CI skip rule.

Tests marked `postgres`, `browser` or `root` skip with a reason where that part is missing;
with CI=true such a skip is turned into a failure, so CI can never pass by skipping them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any
from unittest import mock

import pytest
import pytest_asyncio
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from rest_framework.test import APIClient

CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
CHROMIUM = "/usr/bin/chromium"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres"):
        from django.conf import settings

        if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
            pytest.skip("needs PostgreSQL: set DATABASE_URL=postgres://...")
    if item.get_closest_marker("browser") and not shutil.which(CHROMIUM):
        pytest.skip(f"needs Debian chromium at {CHROMIUM}: apt-get install -y chromium")
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.skip("needs root: the agent switches tasks to other accounts only as root")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names: list[str] = getattr(item, "fixturenames", [])
        if item.get_closest_marker("asyncio") and "websockets_closed" not in names:
            names.append("websockets_closed")


@pytest_asyncio.fixture
async def websockets_closed() -> AsyncGenerator[None]:
    """Every websocket an async test opened is told it is gone at the test's end, as a real
    server tells a consumer (websocket.disconnect) even after the consumer refused the socket.
    Without that a refused consumer still waits on the channel layer when the test's loop
    closes, and cancelling it there could hang the run for good (once per dozen runs, inside
    channels_redis's receive: CI's 90 minutes ran out on it)."""
    opened: list[WebsocketCommunicator] = []
    init = WebsocketCommunicator.__init__

    def tracking(self: WebsocketCommunicator, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        opened.append(self)

    with mock.patch.object(WebsocketCommunicator, "__init__", tracking):
        yield
    for socket in opened:
        if not socket.future.done():
            await socket.disconnect()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[Any]:
    outcome: Any = yield
    report = outcome.get_result()
    needs_part = any(item.get_closest_marker(m) for m in ("postgres", "browser", "root"))
    if CI and needs_part and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run it: {report.longrepr}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    """The test database refuses every state move no state machine allows (scheduler/states/),
    whoever writes it: the whole suite, e2e processes included, checks the tables."""
    from django.db import connection

    from scheduler import sql

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            sql.guard_state_moves(connection)


@pytest.fixture(scope="session", autouse=True)
def _no_task_cgroups_left() -> Generator[None]:
    """Agents run as root (here and as subprocesses: run_agent, up, the e2e clusters) make
    task cgroups under this process's cgroup; one killed on purpose (a node that dies) leaves
    them. After the run, those made during it are killed and removed.

    Only when no other test run is under way on this machine: the folders are named after
    nodes, not runs, so a run's new folders may be another run's live agents' (their tasks
    were SIGKILLed when two runs overlapped). Each run holds a shared lock on
    `RUNS_LOCK` while it runs; the reap takes it exclusively, or is left to the last run."""
    lock = open(RUNS_LOCK, "a+")  # noqa: SIM115 - held for the whole run
    fcntl.flock(lock, fcntl.LOCK_SH)
    before = _agent_cgroups()
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another run is under way: its agents may own the new folders
        else:
            _reap(_agent_cgroups() - before)
        lock.close()


RUNS_LOCK = "/tmp/berth-test-runs.lock"


def _reap(names: set[str]) -> None:
    from scheduler.agent.fence import Fence

    for name in sorted(names):
        fence = Fence("best-effort", base_name=name)
        fence.setup()
        fence.reap(set())
        fence.close()


def _agent_cgroups() -> set[str]:
    """Names of the agents' folders of task cgroups under this process's cgroups (root only)."""
    if os.geteuid() != 0:
        return set()
    from scheduler.agent.cgroups import own_dirs

    return {p.name for d in own_dirs() for p in d.iterdir()
            if p.is_dir() and p.name.startswith("berth-")}  # fmt: skip


@pytest.fixture(autouse=True)
def _plan_every_cycle(settings: Any) -> None:
    """The scheduler makes a full plan at most every BERTH_PLAN_INTERVAL seconds and keeps
    the last estimates in between: tests see each cycle's own plan unless they say otherwise
    (tests/cycle/test_plan_store.py tests the interval)."""
    settings.BERTH_PLAN_INTERVAL = 0


@pytest.fixture(autouse=True)
def _forget_sign_in_attempts() -> None:
    """Failed sign-ins are counted in the cache (Redis, shared by the whole run): start each
    test with none, or one test's wrong join tokens would throttle the next test's agents."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def _forget_recent_offers() -> None:
    """Submissions accept on the nodes' capacities read up to a second ago in this process
    (scheduler/jobs/submit.py): each test starts from its own nodes, not the previous test's."""
    from scheduler.jobs.submit import forget_recent_offers

    forget_recent_offers()


@pytest.fixture
def fresh_fair_share() -> Generator[None]:
    """Fair-share usage is cached in this process (scheduler/cycle/fairshare.py): a test that
    reads or writes it starts and ends with nothing cached or written."""
    from scheduler.cycle import fairshare

    fairshare._cache = None
    fairshare._written.clear()
    yield
    fairshare._cache = None
    fairshare._written.clear()


@pytest.fixture
def owner(db: None) -> User:
    return User.objects.create_user("alice", password="alice-pass-123")


@pytest.fixture
def teammate(db: None) -> User:
    return User.objects.create_user("bob", password="bob-pass-123")


@pytest.fixture
def outsider(db: None) -> User:
    return User.objects.create_user("carol", password="carol-pass-123")


@pytest.fixture
def staff(db: None) -> User:
    return User.objects.create_user(
        "admin", password="admin-pass-123", is_staff=True, is_superuser=True
    )


@pytest.fixture
def api() -> Callable[[User | None], APIClient]:
    """api(user) -> an APIClient signed in as user (None: anonymous)."""

    def make(user: User | None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make
