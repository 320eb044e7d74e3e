"""manage.py run_scheduler refuses to loop where its orders could not reach the agents: the
agents' leases are held by the web tier's processes, woken through the channel layer, and the
in-memory layer does not leave its own process (issue #22: a job suspended by request showed
Suspended while its task ran on until the agent's next lease)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from scheduler.management.commands import run_scheduler

pytestmark = pytest.mark.django_db

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
REDIS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": ["redis://127.0.0.1:6379/7"]},
    }
}


@pytest.fixture
def loops(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The intervals run_loop was entered with (it returns at once instead of looping)."""
    calls: list[float] = []

    def run_loop(lock: Any, interval: float, stop: Any) -> None:
        calls.append(interval)

    monkeypatch.setattr(run_scheduler, "run_loop", run_loop)
    return calls


def test_it_refuses_to_loop_on_the_in_memory_layer(settings: Any, loops: list[float]):
    settings.CHANNEL_LAYERS = IN_MEMORY
    with pytest.raises(CommandError, match="REDIS_URL") as refused:
        call_command("run_scheduler", "--interval", "0.5")
    assert "in-memory" in str(refused.value) and "./run up" in str(refused.value)
    assert loops == []


def test_it_refuses_to_loop_without_a_channel_layer(settings: Any, loops: list[float]):
    settings.CHANNEL_LAYERS = {}
    with pytest.raises(CommandError, match="no channel layer"):
        call_command("run_scheduler")
    assert loops == []


def test_it_loops_on_redis(settings: Any, loops: list[float]):
    settings.CHANNEL_LAYERS = REDIS
    call_command("run_scheduler", "--interval", "0.5")
    assert loops == [0.5]


def test_it_runs_one_cycle_on_the_in_memory_layer(settings: Any, loops: list[float]):
    # `--once` delivers nothing itself that a lease would wait for: tests and scripts use it.
    settings.CHANNEL_LAYERS = IN_MEMORY
    out = io.StringIO()
    call_command("run_scheduler", "--once", stdout=out)
    assert out.getvalue().strip()  # the cycle's report line
    assert loops == []
