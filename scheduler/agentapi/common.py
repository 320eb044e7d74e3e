"""What every agent request shares: the protocol version it must speak, the node its token
names, the error each message answers with, and the node's lease renewed by whatever it sends."""

from __future__ import annotations

import logging
from typing import Any

from scheduler.agent.wire import PROTOCOL
from scheduler.jobs.events import record
from scheduler.lifecycle.moves import move_node
from scheduler.models import Node, hash_token
from scheduler.sql import row_by
from scheduler.states.codes import EventKind, Reason

log = logging.getLogger("berth.agent")
RENEWAL_WRITE_SECONDS = 1.0  # a node's lease renewed more recently than this is not rewritten


class ProtocolError(Exception):
    """A malformed or forbidden request; `errors` names the fields."""

    def __init__(self, errors: dict[str, list[str]], status: int = 400) -> None:
        super().__init__(str(errors))
        self.errors = errors
        self.status = status


def node_for_token(token: str) -> Node | None:
    return row_by(Node, "token_hash", hash_token(token)) if token else None


def check_protocol(header: str | None, body_version: object = None) -> None:
    """Refuse an agent that does not speak this protocol (426, saying what to do)."""
    if header is not None and header.strip() == str(PROTOCOL):
        return
    got = (header or "").strip()[:20]
    if not got:
        # Protocol 1 agents sent no header; at registration they said "berth-agent/1".
        version = str(body_version or "")
        got = version.rpartition("/")[2][:20] if "/" in version else "none"
    raise ProtocolError(
        {"detail": [f"agent protocol {PROTOCOL} required, got {got}; upgrade the agent"],
         "protocol": [str(PROTOCOL)]},
        status=426,
    )  # fmt: skip


def renewal_due(last: Any, now: Any) -> bool:
    """Whether a request must write the node's lease: a renewal less than
    RENEWAL_WRITE_SECONDS old is left as it is (a busy node sends several requests a second;
    node loss is judged over BERTH_HEARTBEAT_TIMEOUT, tens of seconds)."""
    return last is None or (now - last).total_seconds() >= RENEWAL_WRITE_SECONDS


def renew(node: Node, now: Any) -> None:
    """The agent is alive: renew the lease, and bring a NotReady node back (caller saves)."""
    node.last_heartbeat = now
    was = move_node(node, alive=True)
    if was != node.state:
        record(EventKind.NODE_READY, Reason.LEASE_RENEWED, f"{was} -> {node.state}", node=node)


def protocol_error_headers(exc: ProtocolError) -> dict[str, str]:
    """What an agent needs besides the body: which protocol to speak, how to sign in."""
    headers: dict[str, str] = {}
    if exc.status == 426:
        headers["Upgrade"] = f"berth-agent/{PROTOCOL}"
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Node"
    return headers
