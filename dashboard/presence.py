"""Who watches a live group, through the cache's public API (not the channel layer's
internals): each open socket marks its groups present with a TTL and refreshes the mark while
it stays open; a publisher asks for all its candidate groups in one `get_many` round trip and
renders only the fragments somebody has open.

The cache is the same kind of shared store as the channel layer (Redis across processes,
in-process memory for the embedded server and tests). A closed socket's mark is not removed
(another socket may watch the same group) but expires within `TTL` seconds, so a page left
for good costs at most `TTL` seconds of wasted renders."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from django.core.cache import cache

log = logging.getLogger("berth.live")
TTL = 60  # seconds a mark lives without refresh
REFRESH = 20  # seconds between refreshes while a socket is open
PREFIX = "live-watch:"
ANYONE = "*"  # marked by every socket: with nobody on any live page, publishing stops at once


def _key(group: str) -> str:
    return PREFIX + group


async def mark(groups: Iterable[str]) -> None:
    """Say that a socket watches `groups` for the next TTL seconds."""
    try:
        await cache.aset_many({_key(g): 1 for g in [*groups, ANYONE]}, timeout=TTL)
    except Exception:  # publishers then see nobody: pushes stop, the page still works
        log.warning("could not mark live groups %s as watched", list(groups), exc_info=True)


async def keep_marked(groups: list[str]) -> None:
    """Refresh the mark until cancelled (when the socket closes)."""
    while True:
        await asyncio.sleep(REFRESH)
        await mark(groups)


def anyone() -> bool:
    """Whether any live page is open at all (True if the cache cannot say)."""
    try:
        return cache.get(_key(ANYONE)) is not None
    except Exception:
        log.warning("could not read live presence; assuming somebody watches", exc_info=True)
        return True


def watched(groups: Iterable[str]) -> set[str]:
    """The groups somebody watches, in one round trip (all of them if the cache fails)."""
    wanted = list(dict.fromkeys(groups))
    if not wanted:
        return set()
    try:
        found = cache.get_many([_key(g) for g in wanted])
    except Exception:
        log.warning("could not read live presence; pushing to every group", exc_info=True)
        return set(wanted)
    return {g for g in wanted if _key(g) in found}
