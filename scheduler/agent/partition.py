"""An agent cut off from its server stops its tasks before the server gives them up.

The server marks a node NotReady, and its tasks Lost (then retried elsewhere under the job's
policy), once the node's lease is BERTH_HEARTBEAT_TIMEOUT old. The agent cannot tell a lost
network from a server that has given it up, so it counts from the last request the server
certainly renewed its lease with: the moment that request was *sent* (the server renewed it
later, and writes a renewal at most RENEWAL_WRITE_SECONDS late). Past `timeout - MARGIN` of
silence the server may act, so by then every task must be dead: the agent sends SIGTERM a
kill grace earlier (never within two leases of the last contact, the gap between renewals of
a healthy agent) and SIGKILL at that deadline. A task stopped this way is reported `Lost`, so
it follows the job's retry policy as if its node had been lost, and is never run twice at
once on two nodes. A node lease too short to tell a cut-off agent from a healthy one (a
deadline under two leases) turns this guard off, and the agent says so when it registers.
Django-free: the node agent uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The server writes a lease renewal at most a second late (RENEWAL_WRITE_SECONDS in
# scheduler/agentapi/common.py); the rest is for the clocks of the server's hosts (the web
# tier stamps a renewal, the scheduler's host judges it: kept in step by NTP) and for the
# agent's own latency.
MARGIN = 2.5


@dataclass
class PartitionGuard:
    """When this agent last certainly renewed its lease, and what follows from it.
    `timeout` 0 (a server that did not say) disables the guard."""

    timeout: float = 0.0
    lease: float = 10.0
    grace: float = 10.0
    clock: Callable[[], float] = time.monotonic
    contact_at: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.contact_at = self.clock()

    def heard(self, sent_at: float) -> None:
        """A request sent at `sent_at` (this clock) renewed the lease."""
        self.contact_at = max(self.contact_at, sent_at)

    def silence(self) -> float:
        return self.clock() - self.contact_at

    def deadline(self) -> float:
        """Seconds of silence after which no task of ours may still run."""
        return max(0.0, self.timeout - MARGIN)

    def term_after(self) -> float:
        """Seconds of silence after which our tasks get SIGTERM."""
        deadline = self.deadline()
        return max(deadline - self.grace, min(deadline, 2 * self.lease))

    @property
    def enabled(self) -> bool:
        """A server that said its timeout, long enough to tell a cut-off agent from a healthy
        one between two renewals (a deadline of at least two leases; docs/operations.md)."""
        return self.timeout > 0 and self.deadline() >= 2 * self.lease

    def due(self) -> bool:
        """Must our tasks be stopped now?"""
        return self.enabled and self.silence() >= self.term_after()

    def grace_left(self) -> float:
        """How long a task stopped now may take before SIGKILL."""
        return max(0.0, self.deadline() - self.silence())

    def renewal_due(self) -> bool:
        """A lease a lease old, where held leases alone could leave a healthy agent silent
        long enough to be stopped (up to 2.5 leases between two answers, plus a second for the
        network): renew it with a report. At the default timings (a lease of 10 s, a 42.5 s
        timeout) this never happens: the held leases suffice."""
        needed = self.enabled and self.term_after() < 2.5 * self.lease + 1.0
        return needed and self.silence() >= self.lease

    def why(self) -> str:
        return (
            f"cut off from the server for {self.silence():.1f}s (node lease"
            f" {self.timeout:g}s): stopped before its node is declared lost"
        )
