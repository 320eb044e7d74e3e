"""The session the real agent and the simulator share (scheduler/agent/session.py): what a
report's answer means for the tasks it listed, which starts are new, what register/ set."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.agent.session import FORGET_ENDED_SECONDS, MIN_LOG_CHUNK, Session
from scheduler.agent.wire import AwaitingOutput, TaskReport, TaskState


@dataclass
class Attempt:
    id: int
    attempt: int


class Node(Session):
    def __init__(self) -> None:
        self.token, self.lease, self.grace = "", 10.0, 10.0
        self.inline_bytes, self.log_chunk = 0, 1024
        self.tasks: dict[int, Attempt] = {}
        self.ended: dict[tuple[int, int], float] = {}


def test_a_reports_answer_forgets_what_the_server_took_and_returns_what_it_awaits():
    node = Node()
    node.tasks = {1: Attempt(1, 0), 2: Attempt(2, 0), 3: Attempt(3, 1), 4: Attempt(4, 2)}
    node.ended[(9, 0)] = -FORGET_ENDED_SECONDS - 1  # long over: forgotten now
    reported = [
        TaskReport(1, 0, TaskState.SUCCEEDED),
        TaskReport(2, 0, TaskState.FAILED, 1),
        TaskReport(3, 1, TaskState.RUNNING),
        TaskReport(4, 1, TaskState.KILLED),  # an older attempt than the one held now
    ]
    answer = {"awaiting_output": [{"id": 2, "attempt": 0, "have": 5, "want": 9}]}
    taken, short = node.settle(reported, answer, now=1.0)
    assert taken == [Attempt(1, 0)]
    assert short == [(Attempt(2, 0), AwaitingOutput(2, 0, 5, 9))]
    assert set(node.tasks) == {2, 3, 4} and node.ended == {(1, 0): 1.0}


def test_a_start_is_new_unless_its_attempt_is_here_or_over():
    node = Node()
    node.tasks = {1: Attempt(1, 0)}
    node.ended = {(2, 0): 0.0}
    assert not node.is_new(1, 0) and not node.is_new(2, 0)
    assert node.is_new(1, 1) and node.is_new(2, 1) and node.is_new(3, 0)


def test_registration_sets_the_token_and_bounds_the_sizes():
    node = Node()
    answer = {"token": "t", "lease_seconds": 5, "kill_grace_seconds": 3, "heartbeat_timeout": 40,
              "log_chunk_bytes": 10, "inline_output_bytes": 99999}  # fmt: skip
    registered = node.registered(answer, max_chunk=4096)
    assert (node.token, node.lease, node.grace) == ("t", 5.0, 3.0)
    assert node.log_chunk == MIN_LOG_CHUNK and node.inline_bytes == MIN_LOG_CHUNK
    assert registered.heartbeat_timeout == 40.0
