"""CPU time the machine's processes spend while a bench runs, by role (Linux /proc).

A run on one machine shares its cores between the server under test, the database, the
simulated agents and the bench's own clients; the CPU each took, per job, says where the
time goes and what a target would take. Processes are told apart by their command line;
one that started or ended between two snapshots counts what /proc showed of it.
"""

from __future__ import annotations

import os
from pathlib import Path

ROLES = (  # the first match names the role
    ("run_scheduler", "scheduler"),
    ("run_simagent", "agents"),
    ("gunicorn", "web"),
    ("postgres", "postgresql"),
    ("redis", "redis"),
)
TICKS = os.sysconf("SC_CLK_TCK")


def _role(pid: int, cmdline: str) -> str:
    if pid == os.getpid():
        return "bench clients"
    return next((role for key, role in ROLES if key in cmdline), "other")


def snapshot() -> dict[int, tuple[str, int]]:
    """Each process: its role and the CPU ticks it used so far (user and system)."""
    seen: dict[int, tuple[str, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        seen[int(entry.name)] = (_role(int(entry.name), cmdline), int(fields[11]) + int(fields[12]))
    return seen


def used(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> dict[str, float]:
    """CPU seconds by role between two snapshots."""
    total: dict[str, float] = {}
    for pid, (role, ticks) in after.items():
        start = before[pid][1] if pid in before and before[pid][0] == role else 0
        total[role] = total.get(role, 0.0) + (ticks - start) / TICKS
    return {role: round(seconds, 2) for role, seconds in sorted(total.items())}
