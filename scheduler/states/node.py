"""The node state machines: the operator's `Node.admin_state` and the shown `Node.state`.

`admin_state` is what an operator asked: schedulable (""), Cordoned (no new task), Draining
(no new task; Drained once nothing runs there). `state` is what users see: NotReady while the
agent is silent or cannot enforce limits, else the operator's choice (Ready when none;
`Node.derive_state`). A node that comes back takes the state its `admin_state` says.
Writers, each through `move_node` or `move_rows` (scheduler/lifecycle/moves.py):
scheduler/jobs/operations.py (cordon, drain), scheduler/lifecycle/nodes.py (silent, drained),
scheduler/agentapi/ (registered, lease renewed).
"""

from __future__ import annotations

from enum import StrEnum

from scheduler.states.machine import Machine
from scheduler.states.names import NodeState


class AdminState(StrEnum):
    SCHEDULABLE = ""
    CORDONED = NodeState.CORDONED.value
    DRAINING = NodeState.DRAINING.value
    DRAINED = NodeState.DRAINED.value


class NodeEvent(StrEnum):
    CORDON = "cordon"  # an operator: no new task here
    UNCORDON = "uncordon"  # an operator: schedulable again
    DRAIN = "drain"  # an operator: no new task, and Drained once empty
    DRAINED = "drained"  # a draining node has nothing left on it
    LOSE = "lose"  # the agent went silent, or registered unable to enforce limits
    # The agent is back (a lease or a registration): the node shows its admin state again.
    BACK_READY = "back-ready"
    BACK_CORDONED = "back-cordoned"
    BACK_DRAINING = "back-draining"
    BACK_DRAINED = "back-drained"


_S, _C, _D, _DD = (
    AdminState.SCHEDULABLE,
    AdminState.CORDONED,
    AdminState.DRAINING,
    AdminState.DRAINED,
)

ADMIN: Machine[AdminState, NodeEvent] = Machine(
    kind="node admin state",
    states=AdminState,
    initial=_S,
    final=frozenset(),
    table={
        NodeEvent.CORDON: {_S: _C, _C: _C, _D: _C, _DD: _C},
        NodeEvent.UNCORDON: {_S: _S, _C: _S, _D: _S, _DD: _S},
        NodeEvent.DRAIN: {_S: _D, _C: _D, _D: _D},
        NodeEvent.DRAINED: {_D: _DD},
    },
)

_READY, _NOT = NodeState.READY, NodeState.NOT_READY
_CORD, _DRAINING, _DRAINED = NodeState.CORDONED, NodeState.DRAINING, NodeState.DRAINED
_ANY_UP = (_READY, _CORD, _DRAINING, _DRAINED)

SHOWN: Machine[NodeState, NodeEvent] = Machine(
    kind="node",
    states=NodeState,
    initial=_READY,
    final=frozenset(),
    table={
        NodeEvent.CORDON: {s: _CORD for s in _ANY_UP} | {_NOT: _NOT},
        NodeEvent.UNCORDON: {s: _READY for s in _ANY_UP} | {_NOT: _NOT},
        NodeEvent.DRAIN: {_READY: _DRAINING, _CORD: _DRAINING, _DRAINING: _DRAINING, _NOT: _NOT},
        NodeEvent.DRAINED: {_DRAINING: _DRAINED},
        NodeEvent.LOSE: {s: _NOT for s in _ANY_UP},
        NodeEvent.BACK_READY: {_NOT: _READY},
        NodeEvent.BACK_CORDONED: {_NOT: _CORD},
        NodeEvent.BACK_DRAINING: {_NOT: _DRAINING},
        NodeEvent.BACK_DRAINED: {_NOT: _DRAINED},
    },
    into={
        _READY: NodeEvent.BACK_READY,
        _CORD: NodeEvent.BACK_CORDONED,
        _DRAINING: NodeEvent.BACK_DRAINING,
        _DRAINED: NodeEvent.BACK_DRAINED,
        _NOT: NodeEvent.LOSE,
    },  # fmt: skip
)
