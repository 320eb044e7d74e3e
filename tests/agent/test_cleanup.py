"""Nothing piles up on a node: the agent's copy of a task's output holds only what the server
has not taken yet and is deleted once it has the end; work dirs go after a retention time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.agent.test_runtime import RecordingAgent, run_until, start_order

MiB = 2**20


class CappedServer(RecordingAgent):
    """A server that keeps at most `cap` bytes of output, as BERTH_LOG_MAX_BYTES does."""

    cap = MiB

    def _post(self, path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        answer = super()._post(path, body, auth)
        if path.endswith("/log/") and body["offset"] + len(body["data"].encode()) >= self.cap:
            return {"dropped": True}
        return answer


def test_the_agents_copy_of_output_is_bounded_and_deleted_once_shipped(tmp_path):
    agent = CappedServer(tmp_path)
    # 8 MiB of output, then a pause during which the copy on disk is measured.
    command = "head -c 8388608 /dev/zero | tr '\\0' x; touch done; sleep 30"
    agent.answers = [{"start": [start_order(1, command)]}]
    run_until(agent, lambda: 1 in agent.tasks)
    task = agent.tasks[1]
    run_until(agent, lambda: (Path(task.workdir) / "done").exists())
    run_until(agent, lambda: task.dropped)
    agent.step()
    info = task.output.stat()
    assert info.st_size == 8 * MiB and info.st_blocks * 512 <= MiB  # the rest was freed
    agent.kill(task, 0.1)
    run_until(agent, lambda: 1 not in agent.tasks)  # ended, reported, taken
    assert not Path(task.dir).exists()


def test_work_dirs_are_removed_after_their_retention_time(tmp_path):
    agent = RecordingAgent(tmp_path, keep_work_dirs=0.5)
    agent.answers = [{"start": [start_order(1, "echo kept > result"),
                                start_order(2, "sleep 3")]}]  # fmt: skip
    run_until(agent, lambda: 1 in agent.tasks and 2 in agent.tasks)
    first, running = Path(agent.tasks[1].workdir), Path(agent.tasks[2].workdir)
    run_until(agent, lambda: 1 not in agent.tasks)
    assert (first / "result").read_text() == "kept\n"  # kept for a while
    run_until(agent, lambda: not first.exists())
    assert running.exists()  # a running task's dir stays, however old
    time.sleep(0.6)
    agent.step()
    assert running.exists()
