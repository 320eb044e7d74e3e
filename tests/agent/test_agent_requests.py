"""Protocol 3 from the agents' side: a task started on a lease's orders is confirmed by the
next lease (no report of its own), and its short output travels in its final report (no
upload of its own); long output is still uploaded first. Against the scripted server of
test_backpressure.py."""

# ruff: noqa: F811 - `server`, the scripted server's fixture, is imported and then requested

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from scheduler.agent.runtime import Agent
from scheduler.agent.sim import SimCluster
from tests.agent.test_backpressure import (  # noqa: F401 - `server` is its fixture
    FakeServer,
    final_reports,
    server,
    start,
    wait_for,
)

INLINE = 16 * 1024


def listed_running(server: FakeServer, path: str, task_id: int) -> list[dict[str, Any]]:
    return [t for s in server.where(path, 200) for t in s.body["tasks"]
            if t["id"] == task_id and t["state"] == "Running"]  # fmt: skip


def run_until_final(server: FakeServer, target: Any, task_id: int) -> dict[str, Any]:
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(stop,))
    thread.start()
    try:
        (final,) = wait_for(lambda: final_reports(server, task_id))
    finally:
        stop.set()
        thread.join(10)
    return final


def test_the_agent_confirms_a_start_with_its_next_lease_and_ships_short_output_inline(
    server, tmp_path: Path
):  # fmt: skip
    server.inline = INLINE
    server.orders = [start(1, "echo out; sleep 1; echo done")]
    agent = Agent(server.url, "join", name="node-a", work_dir=tmp_path)
    final = run_until_final(server, agent.run, 1)
    assert listed_running(server, "lease/", 1)  # the start, confirmed by a lease
    assert listed_running(server, "report/", 1) == []  # and by no report
    # Output is shipped while the task runs (every second); what is left at its end rides
    # in the final report.
    uploaded = "".join(s.body["data"] for s in server.where("log/", 200))
    assert (final["state"], final["output_bytes"]) == ("Succeeded", 9)
    assert final["output"]["offset"] == len(uploaded.encode())
    assert uploaded + final["output"]["data"] == "out\ndone\n"


def test_the_agent_still_uploads_long_output_before_its_final_report(server, tmp_path: Path):
    server.inline = INLINE
    size = 2 * INLINE + 1  # whatever was shipped while it ran, more than INLINE is left
    server.orders = [start(2, f"yes x | head -c {size}")]
    agent = Agent(server.url, "join", name="node-b", work_dir=tmp_path)
    final = run_until_final(server, agent.run, 2)
    uploaded = "".join(s.body["data"] for s in server.where("log/", 200))
    inline = final.get("output", {}).get("data", "")
    assert len(uploaded) > INLINE and uploaded + inline == ("x\n" * size)[:size]
    assert final["output_bytes"] == size


def test_the_simulated_agent_spends_two_requests_on_a_task(server):
    server.inline = INLINE
    server.orders = [start(7, "sleep 1")]
    server.orders[0]["start"][0]["env"] = {"BERTH_SIM_DURATION": "1"}
    cluster = SimCluster(server.url, "join", nodes=1, gpus=0, cpu=1000, memory=2**30)
    final = run_until_final(server, cluster.run, 7)
    assert listed_running(server, "lease/", 7)
    assert listed_running(server, "report/", 7) == []
    assert server.where("log/") == []
    assert final["output"]["offset"] == 0
    assert len(final["output"]["data"].encode()) == final["output_bytes"] > 0
    assert cluster.sent["log"] == 0 and cluster.sent["report"] >= 1
