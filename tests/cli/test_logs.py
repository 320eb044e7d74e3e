"""`berth logs` against a live server: a task's whole output (longer than the job page's
tail), one task with --task, an earlier attempt with --attempt, never another user's."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner, Result
from rest_framework.authtoken.models import Token

from berth.cli.main import cli
from scheduler.models import Queue, Task, TaskLog
from tests.factories import make_job

CHUNK = 60 * 1024


def store(task: Task, attempt: int, text: str) -> None:
    data = text.encode()
    for at in range(0, len(data), CHUNK):
        chunk = data[at : at + CHUNK].decode()
        TaskLog.objects.create(task=task, attempt=attempt, offset=at, data=chunk)


@pytest.fixture
def berth(live_server: Any, transactional_db: None, tmp_path: Any) -> Any:
    Queue.objects.get_or_create(name="default")  # transactional tests flush the migration's

    def run(user: Any, *args: str) -> Result:
        key = Token.objects.get_or_create(user=user)[0].key
        env = {"BERTH_URL": live_server.url, "BERTH_TOKEN": key, "XDG_CONFIG_HOME": str(tmp_path)}
        return CliRunner().invoke(cli, list(args), env=env)

    return run


def test_it_prints_a_whole_long_log_and_picks_the_attempt(berth, owner):
    task = make_job(owner).tasks.get()
    Task.objects.filter(pk=task.pk).update(attempt=1)
    long = "".join(f"line {i:06d}\n" for i in range(20_000))  # 240 kB: 4 chunks, 12x the tail
    store(task, 0, long)
    store(task, 1, "second try\n")
    latest = berth(owner, "logs", str(task.job_id))
    assert latest.exit_code == 0, latest.output
    assert latest.output == "second try\n"
    earlier = berth(owner, "logs", "--attempt", "0", str(task.job_id))
    assert earlier.exit_code == 0 and earlier.output == long


def test_several_tasks_are_prefixed_and_one_is_picked_by_name(berth, owner):
    job = make_job(owner, replicas=2)
    first, second = job.tasks.order_by("index")
    store(first, 0, "a\nb\n")
    store(second, 0, "c")
    both = berth(owner, "logs", str(job.pk))
    assert both.output == "[main-0] a\n[main-0] b\n[main-1] c"
    one = berth(owner, "logs", "--task", "main-1", str(job.pk))
    assert one.exit_code == 0 and one.output == "c"
    assert berth(owner, "logs", "--task", "1", str(job.pk)).output == "c"
    missing = berth(owner, "logs", "--task", "main-7", str(job.pk))
    assert missing.exit_code == 1 and "main-7 is not a task of this job" in missing.output


def test_another_users_job_is_not_found(berth, owner, outsider):
    task = make_job(owner).tasks.get()
    store(task, 0, "private\n")
    result = berth(outsider, "logs", str(task.job_id))
    assert result.exit_code == 1 and "private" not in result.output
