"""The protocol's messages are defined once (scheduler/agent/wire.py): what an agent sends,
the server reads back as the same message, and the server's answers read back the same."""

from __future__ import annotations

import json

from scheduler.agent.wire import (
    AwaitingOutput,
    InlineOutput,
    KillOrder,
    Orders,
    Registered,
    Registration,
    StartOrder,
    TaskReport,
    TaskState,
)


def _parse(item: object, limit: int = 1024) -> tuple[TaskReport | None, dict[str, list[str]]]:
    errors: dict[str, list[str]] = {}
    return TaskReport.parse(item, "tasks.0", errors, limit, lambda text: text), errors


def _travel(message: dict) -> dict:
    return json.loads(json.dumps(message))


def test_a_task_report_reads_back_as_it_was_sent():
    sent = [
        TaskReport(1, 0, TaskState.RUNNING, started_at=1.7e9, gpu_utilization=42.5),
        TaskReport(2, 1, TaskState.RUNNING, gpu_unmeasured=True),
        TaskReport(3, 2, TaskState.FAILED, 3, "exit 3", 12, started_at=1.7e9,
                   ended_at=1.7e9 + 5, output=InlineOutput(0, "hello\n"),
                   usage={"peak_memory": 10, "cpu_seconds": 1.5}),
        TaskReport(4, 0, TaskState.KILLED, None, "stopped", 0, stopping=True, reason="OutOfMemory"),
    ]  # fmt: skip
    for report in sent:
        back, errors = _parse(_travel(report.to_json()))
        assert errors == {} and back == report


def test_the_states_agents_report_are_the_enum_and_nothing_else():
    assert [s.value for s in TaskState] == ["Running", "Succeeded", "Failed", "Killed", "Lost"]
    _, errors = _parse({"id": 1, "state": "Pending"})
    assert errors == {"tasks.0.state": ["must be one of Failed, Killed, Lost, Running, Succeeded"]}


def test_a_bad_field_is_named_and_inline_output_is_bounded():
    _, errors = _parse({"id": 1, "state": "Failed", "output_bytes": 9,
                        "output": {"offset": 0, "data": "x" * 9}}, limit=4)  # fmt: skip
    assert errors == {
        "tasks.0.exit_code": ["is required for a failed task"],
        "tasks.0.output.data": ["at most 4 bytes inline; send more with tasks/<id>/log/"],
    }
    assert _parse("no")[1] == {"tasks.0": ["must be an object"]}


def test_a_running_report_says_nothing_of_an_end():
    item = TaskReport(1, 0, TaskState.RUNNING, reason="OutOfMemory").to_json()
    assert "reason" not in item and "usage" not in item and "gpu_utilization" not in item
    unmeasured = TaskReport(1, 0, TaskState.RUNNING, gpu_unmeasured=True).to_json()
    assert unmeasured["gpu_utilization"] is None


def test_answers_read_back_as_they_were_sent():
    orders = Orders([{"id": 1}], [KillOrder(2, 0, 10.0)], [AwaitingOutput(3, 1, 5, 9)], 10.0)
    assert Orders.from_json(_travel(orders.to_json())) == orders
    lease = Orders([], [KillOrder(2, 0, 10.0)], lease_seconds=10.0).to_json()
    assert "awaiting_output" not in lease
    registered = Registered("n1", "tok", 10.0, 60.0, 10.0, 65536, 16384)
    assert Registered.from_json(_travel(registered.to_json()), 1.0, 1.0, 1) == registered
    start = StartOrder(5, 0, 7, "job", "main", 0, "echo hi", "alice", {"A": "1"}, [0, 1], 60,
                       {"cpu": 1000, "memory": 2**30})  # fmt: skip
    assert StartOrder.from_json(_travel(start.to_json())) == start


def test_a_registration_travels_cpu_as_users_write_it():
    body = Registration("n1", 4000, 2**30, {}, [], "host", "berth-agent/3").to_json()
    assert body["cpu"] == "4000m" and "enforcement" not in body


def test_a_start_carries_its_gpu_shares_and_a_registration_its_sharing_modes():
    start = StartOrder(5, 0, 7, "job", "main", 0, "python serve.py", "alice", {}, [1], None, {},
                       shares=[0.25], gpu_memory=2**31, mig=[""])  # fmt: skip
    assert StartOrder.from_json(_travel(start.to_json())) == start
    # Shares that do not read as one number in (0, 1] per device are not guessed at.
    bad = StartOrder.from_json({"id": 1, "attempt": 0, "devices": [0, 1], "shares": [0.5, 0]})
    assert (bad.shares, bad.gpu_memory, bad.mig) == ([], None, [])
    body = Registration("n1", 1000, 2**30, {}, [], "host", "v", gpu_sharing=["mps"]).to_json()
    assert body["gpu_sharing"] == ["mps"]
    assert Registration("n1", 1000, 2**30, {}, [], "h", "v").to_json()["gpu_sharing"] == []


def test_a_running_tasks_app_port_travels_and_a_bad_one_is_named():
    back, errors = _parse(_travel(TaskReport(1, 0, TaskState.RUNNING, app_port=8888).to_json()))
    assert errors == {} and back is not None and back.app_port == 8888
    for bad in (0, 65536, -1, "8888", True, 1.5):
        item = {**TaskReport(1, 0, TaskState.RUNNING).to_json(), "app_port": bad}
        assert "tasks.0.app_port" in _parse(item)[1], bad
    order = StartOrder(1, 0, 5, "nb", "main", 0, "jupyter lab", "alice", {}, [], None, {},
                       app="jupyter")  # fmt: skip
    assert StartOrder.from_json(_travel(order.to_json())) == order


def test_a_running_tasks_gpu_mode_travels_and_a_bad_one_is_named():
    back, errors = _parse(_travel(TaskReport(1, 0, TaskState.RUNNING, gpu_mode="mps").to_json()))
    assert errors == {} and back is not None and back.gpu_mode == "mps"
    assert "gpu_mode" not in TaskReport(1, 0, TaskState.RUNNING).to_json()  # whole GPUs
    for bad in ("exclusive", "MPS", 3, ["mig"]):
        item = {**TaskReport(1, 0, TaskState.RUNNING).to_json(), "gpu_mode": bad}
        assert "tasks.0.gpu_mode" in _parse(item)[1], bad
