"""Job ids on the command line (issue #24): `4_0` is element 0 of array 4 in every command
that takes an id, never job 40; anything else that is not plain digits is refused with exit
status 2 before any request, so no other job is ever acted on."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner, Result
from rest_framework.authtoken.models import Token

from berth.cli.ids import JobRef, parse_job_ref
from berth.cli.main import cli
from scheduler.jobs.submit import submit_job
from scheduler.models import Job, Queue
from tests.factories import make_job

BAD = ["+5", " 5", "5 ", "-5", "٥", "５", "1_000", "05", "4_05", "4_0_1", "4__0", "_4", "4_",
       "4x", "", "0x10", "1e3", "9" * 19, "4_0\n"]  # fmt: skip
ID_COMMANDS = [["show"], ["logs"], ["cancel"], ["suspend"], ["resume"], ["resubmit"]]
FLOW_COMMANDS = [["flow", "show"], ["flow", "cancel"], ["flow", "retry"], ["flow", "resubmit"]]


@pytest.mark.parametrize("text", BAD)
def test_it_refuses_anything_but_digits_and_parent_index(text):
    with pytest.raises(ValueError, match="is not"):
        parse_job_ref(text)


def test_it_reads_ids_and_elements():
    assert parse_job_ref("40") == JobRef(40)
    assert parse_job_ref("4_0") == JobRef(4, 0)
    assert parse_job_ref("0") == JobRef(0)
    assert parse_job_ref("123_45") == JobRef(123, 45)
    with pytest.raises(ValueError):
        parse_job_ref("4_0", elements=False)


@pytest.fixture
def berth(live_server: Any, transactional_db: None, tmp_path: Any) -> Any:
    Queue.objects.get_or_create(name="default")

    def run(user: Any, *args: str) -> Result:
        key = Token.objects.get_or_create(user=user)[0].key
        env = {"BERTH_URL": live_server.url, "BERTH_TOKEN": key, "XDG_CONFIG_HOME": str(tmp_path)}
        return CliRunner().invoke(cli, list(args), env=env)

    return run


def array_with_decoys(owner: Any) -> tuple[Job, list[Job], dict[int, Job]]:
    """Array P of elements 0-1, and plain jobs with the ids int() makes of `P_0` and `P_1`."""
    parent = submit_job(
        owner,
        {
            "name": "sweep",
            "array": "0-1",
            "tasks": [
                {"name": "main", "command": "true", "resources": {"cpu": "1", "memory": "1Gi"}}
            ],
        },
    )
    elements = list(Job.objects.filter(array_parent=parent).order_by("array_index"))
    decoys = {i: make_job(owner, f"decoy{i}", id=int(f"{parent.pk}{i}")) for i in (0, 1)}
    return parent, elements, decoys


def test_every_id_command_reads_parent_index_as_the_element(berth, owner):
    parent, elements, decoys = array_with_decoys(owner)
    shown = berth(owner, "show", f"{parent.pk}_1")
    assert shown.exit_code == 0, shown.output
    assert f"id: {elements[1].pk}" in shown.output and "decoy" not in shown.output
    assert berth(owner, "logs", f"{parent.pk}_0").exit_code == 0
    suspended = berth(owner, "suspend", f"{parent.pk}_0")
    assert suspended.exit_code == 0, suspended.output
    assert f"job {parent.pk}_0: suspend requested" in suspended.output
    assert Job.objects.get(pk=elements[0].pk).requested_action == "suspend"
    Job.objects.filter(pk=elements[0].pk).update(requested_action="", state="Suspended")
    assert berth(owner, "resume", f"{parent.pk}_0").exit_code == 0
    assert Job.objects.get(pk=elements[0].pk).requested_action == "resume"
    cancelled = berth(owner, "cancel", f"{parent.pk}_1")
    assert cancelled.exit_code == 0, cancelled.output
    assert Job.objects.get(pk=elements[1].pk).requested_action == "cancel"
    copied = berth(owner, "resubmit", f"{parent.pk}_1")
    assert copied.exit_code == 0 and f"a copy of job {parent.pk}_1" in copied.output
    new_id = int(copied.output.split()[2])
    assert Job.objects.get(pk=new_id).spec["name"] == elements[1].spec["name"]
    for decoy in decoys.values():
        assert Job.objects.get(pk=decoy.pk).requested_action == ""


@pytest.mark.parametrize("command", ID_COMMANDS + FLOW_COMMANDS)
def test_every_id_command_refuses_a_bad_id_with_status_2_and_touches_nothing(berth, owner, command):
    parent, _, decoys = array_with_decoys(owner)
    texts = [f"+{parent.pk}", f" {parent.pk}", f"{parent.pk}_00", "٥", "1_000"]
    if command[0] == "flow":
        texts.append(f"{parent.pk}_0")
    for text in texts:
        result = berth(owner, *command, text)
        assert result.exit_code == 2, (text, result.output)
        assert "is not" in result.output
    assert not Job.objects.exclude(requested_action="").exists()
    assert Job.objects.count() == 5  # nothing resubmitted


def test_a_missing_element_is_an_error_not_another_job(berth, owner, outsider):
    parent, _, decoys = array_with_decoys(owner)
    missing = berth(owner, "cancel", f"{parent.pk}_7", f"{parent.pk}_1")
    assert missing.exit_code == 1
    assert f"job {parent.pk}_7: no such array element" in missing.output
    assert f"job {parent.pk}_1: cancel requested" in missing.output  # the others still go
    plain = berth(owner, "show", f"{decoys[0].pk}_0")
    assert plain.exit_code == 1 and "no such array element" in plain.output
    theirs = berth(outsider, "cancel", f"{parent.pk}_0")
    assert theirs.exit_code == 1 and "no such array element" in theirs.output
    assert Job.objects.filter(requested_action="cancel").count() == 1
