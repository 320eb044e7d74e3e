"""Terminal sessions' websockets (docs/interactive.md): the user's end (`/ws/jobs/<id>/shell/`)
and the node agent's (`/ws/agent/sessions/<key>/`), relayed through the channel layer; who
may open either end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connections
from rest_framework.authtoken.models import Token

from berth.asgi import application
from scheduler.jobs import terminals
from scheduler.models import Event, Job, Node, Queue, ShellSession, hash_token
from tests.factories import make_job, make_node, place

ORIGIN = (b"origin", b"http://127.0.0.1")
PROTOCOL = (b"berth-agent-protocol", b"3")
pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def _setup() -> dict[str, Any]:
    alice = User.objects.create_user("alice")
    carol = User.objects.create_user("carol")
    admin = User.objects.create_user("admin", is_staff=True)
    node_a = make_node("node-a", token_hash=hash_token("token-of-node-a"))
    make_node("node-b", token_hash=hash_token("token-of-node-b"))
    job = make_job(alice, "work")
    place(job, node_a)
    pending = make_job(alice, "waiting")
    keys = {u.username: Token.objects.create(user=u).key for u in (alice, carol, admin)}
    return {"job": job.pk, "pending": pending.pk, "keys": keys, "node": node_a.pk}


async def _user(job_id: int, key: str | None) -> tuple[WebsocketCommunicator, Any, Any]:
    headers = [ORIGIN] + ([(b"authorization", f"Token {key}".encode())] if key else [])
    socket = WebsocketCommunicator(application, f"/ws/jobs/{job_id}/shell/", headers=headers)
    connected, code = await socket.connect(timeout=10)
    return socket, connected, code


async def _agent(session: str, token: str | None) -> tuple[WebsocketCommunicator, Any, Any]:
    headers = [ORIGIN, PROTOCOL] + ([(b"authorization", f"Node {token}".encode())] if token else [])
    path = f"/ws/agent/sessions/{session}/"
    socket = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await socket.connect(timeout=10)
    return socket, connected, code


async def _open(socket: WebsocketCommunicator, job_id: int) -> str:
    await socket.send_json_to({"type": "open", "command": "bash", "rows": 30, "cols": 100})
    session = await _wait_session(job_id)
    return session.key


async def _session_ready(
    rows: dict[str, Any],
) -> tuple[WebsocketCommunicator, WebsocketCommunicator]:
    """Alice's socket on the running job opens a session, node-a's agent joins it, and the
    user is told it is ready: both sockets."""
    user, _, _ = await _user(rows["job"], rows["keys"]["alice"])
    key = await _open(user, rows["job"])
    agent, _, _ = await _agent(key, "token-of-node-a")
    await user.receive_from(timeout=5)  # ready
    return user, agent


async def _wait_session(job_id: int, state: str | None = None) -> ShellSession:
    """The job's session once the consumer made it (in `state`, when given)."""
    for _ in range(500):
        found = await database_sync_to_async(
            lambda: ShellSession.objects.filter(job_id=job_id).first()
        )()
        if found is not None and (state is None or found.state == state):
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"no session of job {job_id} in state {state}")


async def _close(*sockets: WebsocketCommunicator) -> None:
    for socket in sockets:
        await socket.disconnect()
    await sync_to_async(connections.close_all)()


async def test_frames_go_both_ways_and_the_session_ends_with_the_remote_exit_status():
    rows = await database_sync_to_async(_setup)()
    user, ok, _ = await _user(rows["job"], rows["keys"]["alice"])
    assert ok
    key = await _open(user, rows["job"])
    # The node's lease orders it once (not again while it opens), and no other node's.
    node = await database_sync_to_async(Node.objects.get)(pk=rows["node"])
    orders = await database_sync_to_async(terminals.terminal_orders)(node, [])
    assert [(o["session"], o["rows"], o["cols"], o["command"]) for o in orders] == [
        (key, 30, 100, "bash")
    ]
    assert await database_sync_to_async(terminals.terminal_orders)(node, []) == []

    agent, ok, _ = await _agent(key, "token-of-node-a")
    assert ok
    assert json.loads(await user.receive_from(timeout=5))["type"] == "ready"
    await user.send_to(bytes_data=b"ls\r")
    assert await agent.receive_from(timeout=5) == b"ls\r"
    await user.send_json_to({"type": "resize", "rows": 40, "cols": 120})
    assert json.loads(await agent.receive_from(timeout=5)) == {"type": "resize", "rows": 40,
                                                               "cols": 120}  # fmt: skip
    await agent.send_to(bytes_data=b"file.txt\r\n")
    assert await user.receive_from(timeout=5) == b"file.txt\r\n"
    # Delivered output is acknowledged to the agent, which holds back past its window.
    assert json.loads(await agent.receive_from(timeout=5)) == {"type": "ack", "n": 1}
    await agent.send_json_to({"type": "exit", "status": 7})
    assert json.loads(await user.receive_from(timeout=5)) == {"type": "exit", "status": 7}
    session = await _wait_session(rows["job"], "Closed")
    assert (session.state, session.reason, session.exit_status) == ("Closed", "Exited", 7)
    kinds = await database_sync_to_async(
        lambda: list(Event.objects.filter(job_id=rows["job"]).values_list("kind", flat=True))
    )()
    assert kinds.count("ShellOpened") == 1 and kinds.count("ShellClosed") == 1
    await _close(user, agent)


async def test_the_users_end_is_refused_to_anyone_but_the_owner():
    rows = await database_sync_to_async(_setup)()
    _, ok, code = await _user(rows["job"], None)  # no cookie, no token
    assert (ok, code) == (False, 4401)
    _, ok, code = await _user(rows["job"], "not-a-token")
    assert (ok, code) == (False, 4401)
    _, ok, code = await _user(rows["job"], rows["keys"]["carol"])
    assert (ok, code) == (False, 4404)  # as if the job did not exist
    _, ok, code = await _user(rows["job"], rows["keys"]["admin"])
    assert (ok, code) == (False, 4404)  # staff only where the queue allows it
    await database_sync_to_async(Queue.objects.filter(name="default").update)(staff_shell=True)
    staff, ok, _ = await _user(rows["job"], rows["keys"]["admin"])
    assert ok
    await _close(staff)


async def test_a_job_that_does_not_run_gets_no_session():
    rows = await database_sync_to_async(_setup)()
    user, ok, _ = await _user(rows["pending"], rows["keys"]["alice"])
    assert ok
    await user.send_json_to({"type": "open"})
    message = json.loads(await user.receive_from(timeout=5))
    assert message["type"] == "error" and "running job" in message["message"]
    assert (await user.receive_output(timeout=5))["code"] == 4409
    await _close(user)


async def test_the_agents_end_is_refused_without_the_sessions_own_nodes_token():
    rows = await database_sync_to_async(_setup)()
    user, _, _ = await _user(rows["job"], rows["keys"]["alice"])
    key = await _open(user, rows["job"])
    _, ok, code = await _agent(key, None)
    assert (ok, code) == (False, 4401)
    _, ok, code = await _agent(key, "no-such-node-token")
    assert (ok, code) == (False, 4401)
    _, ok, code = await _agent(key, "token-of-node-b")  # a node, but not this session's
    assert (ok, code) == (False, 4404)
    _, ok, code = await _agent("0" * 48, "token-of-node-a")  # no such session
    assert (ok, code) == (False, 4404)
    agent, ok, _ = await _agent(key, "token-of-node-a")
    assert ok
    _, ok, code = await _agent(key, "token-of-node-a")  # opened once only
    assert (ok, code) == (False, 4404)
    await _close(user, agent)


@pytest.mark.parametrize("token", [None, "no-such-node-token", "token-of-node-b"])
async def test_a_refused_agent_socket_leaves_the_session_as_it_was(token: str | None) -> None:
    """A socket that never proved the session its node's (no token, another node's) knows
    its key from its URL alone: its end, as the server tells it after refusing the
    handshake, must not close the session."""
    rows = await database_sync_to_async(_setup)()
    user, _, _ = await _user(rows["job"], rows["keys"]["alice"])
    key = await _open(user, rows["job"])
    refused, ok, _ = await _agent(key, token)
    assert not ok
    await refused.disconnect()  # (the websocket.disconnect a server sends after a refusal)
    await asyncio.sleep(0.2)
    session = await _wait_session(rows["job"])
    assert (session.state, session.reason) == ("Requested", "")
    agent, ok, _ = await _agent(key, "token-of-node-a")
    assert ok and json.loads(await user.receive_from(timeout=5))["type"] == "ready"
    await _close(user, agent)


async def test_an_oversized_frame_ends_the_session_and_nothing_else():
    rows = await database_sync_to_async(_setup)()
    user, agent = await _session_ready(rows)
    await user.send_to(bytes_data=b"x" * (64 * 1024))
    message = json.loads(await user.receive_from(timeout=5))
    assert message["type"] == "error" and "at most" in message["message"]
    assert json.loads(await agent.receive_from(timeout=5))["type"] == "hangup"
    session = await _wait_session(rows["job"], "Closed")
    assert (session.state, session.reason) == ("Closed", "Failed")
    job = await database_sync_to_async(Job.objects.get)(pk=rows["job"])
    assert job.state == "Running"  # a batch job: its session's end is not its end
    await _close(user, agent)


@pytest.mark.parametrize(
    ("reason", "status", "told"),
    [("Exited", 3, {"type": "exit", "status": 3}),
     ("AgentGone", None, {"type": "error", "message": "the session ended (AgentGone)"})],
)  # fmt: skip
async def test_the_user_learns_of_an_end_whose_message_was_lost_from_the_sessions_row(
    monkeypatch: pytest.MonkeyPatch, reason: str, status: int | None, told: dict[str, Any]
) -> None:
    """The agent's end closed the row, but its message through the channel layer never came
    (as once in CI, cause untraced): the user's socket reads the row and ends all the same."""
    from dashboard import shell

    monkeypatch.setattr(shell, "WATCH_SECONDS", 0.2)
    rows = await database_sync_to_async(_setup)()
    user, agent = await _session_ready(rows)
    key = (await _wait_session(rows["job"])).key
    await database_sync_to_async(terminals.close_session)(key, reason, exit_status=status)
    assert json.loads(await user.receive_from(timeout=5)) == told
    assert (await user.receive_output(timeout=5))["type"] == "websocket.close"
    await _close(user, agent)


async def test_an_end_told_by_the_row_and_then_by_its_late_message_is_told_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dashboard import shell

    monkeypatch.setattr(shell, "WATCH_SECONDS", 0.2)
    rows = await database_sync_to_async(_setup)()
    user, agent = await _session_ready(rows)
    key = (await _wait_session(rows["job"])).key
    await database_sync_to_async(terminals.close_session)(key, "Exited", exit_status=0)
    assert json.loads(await user.receive_from(timeout=5)) == {"type": "exit", "status": 0}
    await agent.send_json_to({"type": "exit", "status": 0})  # the message, late
    assert (await user.receive_output(timeout=5))["type"] == "websocket.close"
    assert await user.receive_nothing(timeout=1.0)
    await _close(user, agent)


async def test_a_failed_input_mark_does_not_end_the_relay(monkeypatch: pytest.MonkeyPatch):
    """Marking the input time is bookkeeping: the database refusing it (under load) must not
    end the agent's end of the relay, which would leave the exit that follows untold."""
    from django.db import OperationalError

    def refuse(key: str) -> None:
        raise OperationalError("couldn't get a connection after 5.00 sec")

    monkeypatch.setattr(terminals, "mark_input", refuse)
    rows = await database_sync_to_async(_setup)()
    user, agent = await _session_ready(rows)
    await user.send_to(bytes_data=b"exit\r")
    assert await agent.receive_from(timeout=5) == b"exit\r"
    await agent.send_json_to({"type": "exit", "status": 0})
    assert json.loads(await user.receive_from(timeout=5)) == {"type": "exit", "status": 0}
    await _close(user, agent)


async def test_an_unexpected_error_in_the_agents_end_ends_the_session_for_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from scheduler.agentapi.terminal import AgentTerminalConsumer

    async def broken(self: Any, event: dict[str, Any]) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(AgentTerminalConsumer, "shell_resize", broken)
    rows = await database_sync_to_async(_setup)()
    user, agent = await _session_ready(rows)
    await user.send_json_to({"type": "resize", "rows": 40, "cols": 120})
    told = json.loads(await user.receive_from(timeout=5))
    assert told == {"type": "error", "message": "the session's relay failed on the server"}
    closed = await agent.receive_output(timeout=5)
    assert (closed["type"], closed.get("code")) == ("websocket.close", 1011)
    session = await _wait_session(rows["job"], "Closed")
    assert session.reason == "Failed"
    await _close(user, agent)


async def test_an_unexpected_error_in_the_users_end_ends_the_session_for_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dashboard.shell import ShellConsumer

    async def broken(self: Any, event: dict[str, Any]) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ShellConsumer, "shell_output", broken)
    rows = await database_sync_to_async(_setup)()
    user, agent = await _session_ready(rows)
    await agent.send_to(bytes_data=b"output\r\n")
    told = json.loads(await user.receive_from(timeout=5))
    assert told == {"type": "error", "message": "the session failed on the server"}
    assert (await user.receive_output(timeout=5)).get("code") == 1011
    assert json.loads(await agent.receive_from(timeout=5))["type"] == "hangup"
    session = await _wait_session(rows["job"], "Closed")
    assert session.reason == "Failed"
    await _close(user, agent)


@pytest.mark.parametrize("trigger", ["output", "oversized"])
async def test_a_users_end_that_fails_with_its_client_gone_still_ends_the_session(
    monkeypatch: pytest.MonkeyPatch, trigger: str
) -> None:
    """As under uvicorn when the user's client went away: the error cannot be told to the
    user, and the row and the agent's end are ended all the same (else the agent's terminal
    would run on, and the row count against the job's sessions)."""
    from dashboard.shell import ShellConsumer

    async def gone(self: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError("the client went away")

    rows = await database_sync_to_async(_setup)()
    user, agent = await _session_ready(rows)
    monkeypatch.setattr(ShellConsumer, "send", gone)
    if trigger == "output":  # a failure: telling the user of output
        await agent.send_to(bytes_data=b"output\r\n")
    else:  # a refusal: the user's end ends the session itself, and cannot say why
        await user.send_to(bytes_data=b"x" * (64 * 1024))
    assert json.loads(await agent.receive_from(timeout=5))["type"] == "hangup"
    session = await _wait_session(rows["job"], "Closed")
    assert session.reason == "Failed"
    await _close(user, agent)


async def test_keystrokes_typed_fast_all_arrive_in_order():
    rows = await database_sync_to_async(_setup)()
    user, agent = await _session_ready(rows)
    typed = b"echo typed-$((6 * 7)) $BERTH_JOB_ID\r"
    for byte in typed:
        await user.send_to(bytes_data=bytes([byte]))
    got = b""
    while len(got) < len(typed):
        got += await agent.receive_from(timeout=5)
    assert got == typed
    await _close(user, agent)


@pytest.mark.parametrize("persist", [False, True])
async def test_an_idle_session_ends_by_the_queues_policy_and_its_job_unless_it_persists(persist):
    rows = await database_sync_to_async(_setup)()

    def interactive() -> None:
        Queue.objects.filter(name="default").update(interactive_idle_minutes=0.02)  # 1.2 s
        job = Job.objects.get(pk=rows["job"])
        job.spec = {**job.spec, "interactive": {"persist": persist}}
        job.save(update_fields=["spec"])

    await database_sync_to_async(interactive)()
    user, agent = await _session_ready(rows)  # then no input at all
    message = json.loads(await user.receive_from(timeout=10))
    assert message["type"] == "error" and "no input for 0.02 minutes" in message["message"]
    assert json.loads(await agent.receive_from(timeout=5)) == {"type": "hangup", "reason": "Idle"}
    session = await _wait_session(rows["job"], "Closed")
    assert session.reason == "Idle"
    job = await database_sync_to_async(Job.objects.get)(pk=rows["job"])
    # Ended by policy: the job with it (Cancelled once its task stopped), unless it persists.
    ended = ("Running", "") if persist else ("Terminating", "Cancelled")
    assert (job.state, job.terminal_state) == ended
    await _close(user, agent)
