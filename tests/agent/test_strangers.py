"""Users are strangers: users without a Unix account on the node each run under a uid of their
own (stable, never shared), and cannot read each other's environment, work dirs or output."""

from __future__ import annotations

import json
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.agent.isolation import UidMap, parse_uid_range
from tests.agent.test_runtime import RecordingAgent, run_until, start_order

RANGE = (3_100_000, 3_100_099)


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A work base every account can pass through (tmp_path's parents are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="berth-strangers-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder / "work"
    shutil.rmtree(folder)


def owned(task_id: int, command: str, owner: str, **env: str) -> dict[str, object]:
    return {**start_order(task_id, command, **env), "owner": owner}


@pytest.mark.root
def test_two_users_without_accounts_cannot_read_each_others_env_dirs_or_output(open_base):
    agent = RecordingAgent(open_base, task_uids=RANGE)
    secret = "echo bob-output-secret; id -u > uid; sleep 30"
    agent.answers = [{"start": [owned(1, secret, "bob-stranger", TOKEN="bob-env-secret")]}]
    run_until(agent, lambda: 1 in agent.tasks and (Path(agent.tasks[1].workdir) / "uid").exists())
    bob = agent.tasks[1]
    probe = "; ".join([
        "id -u",
        f"cat /proc/{bob.pid}/environ",
        f"ls {bob.workdir}",
        f"cat {bob.output}",
        f"cat {agent.state_file}",
        "echo probe-done",
    ])  # fmt: skip
    agent.order({"start": [owned(2, f"exec 2>&1; {probe}", "ann-stranger")]})
    run_until(agent, lambda: any(r["id"] == 2 and r["state"] != "Running" for r in agent.reports()))
    seen = agent.output(2)
    ann_uid, bob_uid = int(seen.split()[0]), int((Path(bob.workdir) / "uid").read_text())
    assert ann_uid != bob_uid and all(RANGE[0] <= u <= RANGE[1] for u in (ann_uid, bob_uid))
    assert "probe-done" in seen and seen.count("Permission denied") == 4, seen
    assert "bob-env-secret" not in seen and "bob-output-secret" not in seen
    agent.kill(bob, 0.1)
    run_until(agent, lambda: any(r["id"] == 1 and r["state"] == "Killed" for r in agent.reports()))


@pytest.mark.root
def test_a_user_keeps_its_uid_and_never_shares_one(tmp_path):
    uids = UidMap(RANGE, tmp_path / "uids.json")
    first = {name: uids.uid(name) for name in ("ann", "bob", "cy")}
    assert len(set(first.values())) == 3
    again = UidMap(RANGE, tmp_path / "uids.json")  # an agent restarted
    assert {name: again.uid(name) for name in first} == first
    assert json.loads((tmp_path / "uids.json").read_text()) == first


def test_colliding_users_get_the_next_free_uid_and_never_an_existing_account(tmp_path):
    nobody = pwd.getpwnam("nobody").pw_uid
    uids = UidMap((nobody - 1, nobody + 1), tmp_path / "uids.json")
    free = [u for u in (nobody - 1, nobody, nobody + 1) if not _exists(u)]
    given = [uids.uid(f"user-{i}") for i in range(len(free))]
    assert sorted(given) == free  # all different, none of them nobody's
    with pytest.raises(ValueError, match="no uid left"):
        uids.uid("one-too-many")


def _exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


@pytest.mark.parametrize(("text", "expected"), [("off", None), ("3000000-3000009",
                                                                (3000000, 3000009))])  # fmt: skip
def test_the_uid_range_is_start_end_or_off(text, expected):
    assert parse_uid_range(text) == expected


@pytest.mark.parametrize("text", ["0-99", "5-", "9000-8000", "a-b"])
def test_a_bad_uid_range_is_refused(text):
    with pytest.raises(ValueError):
        parse_uid_range(text)


@pytest.mark.root
def test_each_task_has_a_private_tmp_that_is_gone_when_it_ends(tmp_path):
    name = f"berth-private-{tmp_path.name}"
    agent = RecordingAgent(tmp_path)
    writer = f"stat -f -c %T /tmp; echo mine > /tmp/{name}; ls /tmp; sleep 30"
    agent.answers = [{"start": [start_order(1, writer)]}]
    run_until(agent, lambda: name in agent.output(1) or "mine" in _read(agent, 1))
    agent.order({"start": [start_order(2, f"ls /tmp/{name} 2>&1; ls -A /tmp | wc -l")]})
    run_until(agent, lambda: any(r["id"] == 2 and r["state"] != "Running" for r in agent.reports()))
    assert "No such file" in agent.output(2) and agent.output(2).split()[-1] == "0"
    assert not Path(f"/tmp/{name}").exists()  # not the node's /tmp either
    agent.kill(agent.tasks[1], 0.1)
    run_until(agent, lambda: any(r["id"] == 1 and r["state"] == "Killed" for r in agent.reports()))
    assert _read(agent, 1).splitlines()[:2] == ["tmpfs", name]
    assert not Path(f"/tmp/{name}").exists()


def _read(agent: RecordingAgent, task_id: int) -> str:
    """A task's output file as the agent holds it (shipped or not yet)."""
    task = agent.tasks.get(task_id)
    return agent.output(task_id) if task is None else task.output.read_text()
