"""A state machine as a table: for each event, the state it moves an object from and the state
it moves it to. One class serves every kind (job.py, task.py, flow.py, node.py); each kind's
module holds its table and nothing else decides how that kind may move.

Each event also names what the move implies besides the state (`Effects`: the reason code it
records when its writer names none, the fields it clears, the times it stamps, whether the
object is done). Writers do not spell these out: they call the movers of their kind
(scheduler/lifecycle/moves.py for jobs), which read them here. Single-row movers ask
`next_state`; set-based UPDATEs take their WHERE clause from `sources` and their constant from
`target` (or a CASE from `case_sql`). A move no event allows is a bug in the caller:
`IllegalTransition`, never a user error. The test suite's database refuses such
a move whoever writes it (tests/conftest.py installs one trigger per table from `allowed_moves`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Generic, TypeVar

S = TypeVar("S", bound=StrEnum)
E = TypeVar("E", bound=StrEnum)


class IllegalTransition(ValueError):
    """A move the table does not allow: a bug in the caller, never a user error."""


@dataclass(frozen=True)
class Effects:
    """What one event's move writes besides the state."""

    reason: str = ""  # the reason code it records when its writer names a no more precise one
    clears: Mapping[str, object] = field(default_factory=dict)  # field -> the value it resets to
    stamps: tuple[str, ...] = ()  # time fields set to the move's time where still empty
    times: tuple[str, ...] = ()  # time fields set to the move's time
    ends: bool = False  # the object is done: it is counted as finished
    # Whether a move that leaves the state as it was is recorded too (a restart of a pending
    # job is news; a placement records its own event, not "Pending -> Pending").
    record_stay: bool = True

    def cleared(self) -> dict[str, object]:
        """The cleared fields with fresh values (a cleared dict or list is never shared)."""
        out: dict[str, object] = {}
        for name, value in self.clears.items():
            out[name] = type(value)() if isinstance(value, dict | list) else value
        return out


_NO_EFFECTS = Effects()


@dataclass(frozen=True)
class Machine(Generic[S, E]):
    """`table`: event -> {state it moves an object from: state it moves it to}."""

    kind: str  # what moves: "job", "task", ...
    states: type[S]
    initial: S
    final: frozenset[S]
    table: Mapping[E, Mapping[S, S]]
    # The event that brings an object into a state, for callers that name where it goes
    # rather than why.
    into: Mapping[S, E] = field(default_factory=dict)
    # What each event's move writes besides the state (an event without an entry: nothing).
    effects: Mapping[E, Effects] = field(default_factory=dict)

    def __post_init__(self) -> None:
        frozen = {e: MappingProxyType(dict(m)) for e, m in self.table.items()}
        object.__setattr__(self, "table", MappingProxyType(frozen))
        object.__setattr__(self, "into", MappingProxyType(dict(self.into)))
        object.__setattr__(self, "effects", MappingProxyType(dict(self.effects)))
        if stray := set(self.effects) - set(self.table):
            raise ValueError(f"{self.kind}: effects of events without moves: {sorted(stray)}")
        for event, moves in self.table.items():
            if left := [s for s in moves if s in self.final and moves[s] != s]:
                raise ValueError(f"{self.kind}: {event} leaves final {left}")

    def next_state(self, state: str, event: E) -> S:
        """Where `event` takes an object that is in `state`; IllegalTransition if it may not."""
        found = self.table[event].get(self.states(state))
        if found is None:
            raise IllegalTransition(f"a {state} {self.kind} cannot {event}")
        return found

    def effects_of(self, event: E) -> Effects:
        return self.effects.get(event, _NO_EFFECTS)

    def event_into(self, state: str) -> E:
        try:
            return self.into[self.states(state)]
        except (KeyError, ValueError):
            raise IllegalTransition(f"no {self.kind} event is named by {state!r}") from None

    def sources(self, event: E, only: Iterable[str] | None = None) -> tuple[S, ...]:
        """The states `event` may move an object from, for a set-based UPDATE's WHERE clause;
        `only` narrows them, and naming one the event may not leave raises."""
        allowed = tuple(self.table[event])
        if only is None:
            return allowed
        wanted = tuple(self.states(s) for s in only)
        if refused := [s for s in wanted if s not in allowed]:
            raise IllegalTransition(f"{event} cannot move a {self.kind} from {', '.join(refused)}")
        return wanted

    def target(self, event: E) -> S:
        """The one state `event` leads to, for a set-based UPDATE that writes a constant."""
        targets = set(self.table[event].values())
        if len(targets) != 1:
            raise IllegalTransition(f"{event} leads to {sorted(targets)}, not to one state")
        return targets.pop()

    def case_sql(self, event: E, column: str = "state") -> str:
        """An SQL assignment applying `event` to each row by its own state (states are fixed
        identifiers from the enum, never user input)."""
        moves = [(s, t) for s, t in self.table[event].items() if s != t]
        whens = " ".join(f"WHEN {column} = '{s.value}' THEN '{t.value}'" for s, t in moves)
        return f"{column} = CASE {whens} ELSE {column} END"

    def allows(self, old: str, new: str) -> bool:
        """Some event moves an object from `old` to `new`."""
        return any(moves.get(self.states(old)) == new for moves in self.table.values())

    def allowed_moves(self) -> frozenset[tuple[str, str]]:
        """Every (from, to) pair some event makes, staying put excluded."""
        return frozenset(
            (s.value, t.value) for moves in self.table.values() for s, t in moves.items() if s != t
        )

    def reachable(self) -> set[S]:
        """Every state some sequence of events leads to from `initial`."""
        reached, frontier = {self.initial}, [self.initial]
        while frontier:
            state = frontier.pop()
            for moves in self.table.values():
                if state in moves and moves[state] not in reached:
                    reached.add(moves[state])
                    frontier.append(moves[state])
        return reached
