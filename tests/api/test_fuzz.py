"""A bounded fuzz run of the whole OpenAPI schema (/api/schema/) against the app in-process:
every operation, generated valid and invalid inputs, sent as staff, as a regular user, with the
join token and with a node token. No input may make a server error (5xx).

Deterministic (derandomized) and small (a few examples per operation), so CI runs it in well
under a minute; run `BERTH_FUZZ_EXAMPLES=200 pytest tests/api/test_fuzz.py` to dig deeper."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error

from scheduler.agentapi.register import register
from scheduler.jobs.submit import create_flow, submit_job
from scheduler.models import JobTemplate
from tests.factories import make_node

JOIN = "fuzz-join-token"
EXAMPLES = int(os.environ.get("BERTH_FUZZ_EXAMPLES", "3"))


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    """The users sign in by token here: hashing their passwords slowly buys nothing."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def one_connection() -> Iterator[None]:
    """Keep the test's database connection across requests, as Django's test client does:
    the WSGI handler would close it after each one (and with it the test's transaction)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def identities(db: None, one_connection: None, owner: Any, staff: Any, settings: Any) -> list[str]:
    """One Authorization header per kind of caller, over a small cluster they can act on."""
    settings.BERTH_JOIN_TOKEN = JOIN
    make_node("gpu-01", gpus=1)
    node = register({"name": "n1", "cpu": "4", "memory": "8Gi"})
    JobTemplate.objects.create(name="t", spec={"tasks": [{"command": "true"}]})
    submit_job(owner, {"name": "j", "tasks": [{"command": "true"}]})
    create_flow(owner, {"name": "f", "steps": [{"name": "a", "template": "t"}]})
    return [
        f"Token {Token.objects.create(user=staff).key}",
        f"Token {Token.objects.create(user=owner).key}",
        f"Bearer {JOIN}",
        f"Node {node['token']}",
    ]


# Loaded while tests are collected (an anonymous read: the schema is public); one test per
# operation. (schemathesis.pytest.from_fixture would load it later but needs pytest < 9.)
schema = schemathesis.openapi.from_wsgi("/api/schema/", WSGIHandler())


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_input_makes_a_server_error(case: Any, identities: list[str]) -> None:
    # Agent endpoints get the agent's credentials too; the rest staff's and a user's.
    callers = identities if "/agent/" in case.path else identities[:2]
    for authorization in callers:
        response = case.call(headers={"Authorization": authorization})
        case.validate_response(response, checks=[not_a_server_error])
