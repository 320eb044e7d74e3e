"""What the pages show of a job array: its elements, a page at a time, by index."""

from __future__ import annotations

from typing import Any

from django.http import QueryDict

from scheduler.models import Job
from scheduler.states.names import JobState

ELEMENTS_PAGE = 100


def element_page(parent: Job, params: QueryDict) -> dict[str, Any]:
    """One page of `parent`'s elements in index order, optionally of one state only;
    keyset-paged by index (`after`), so a page costs the same at 100,000 elements."""
    state = params.get("state", "")
    after = params.get("after", "")
    rows = Job.objects.filter(array_parent=parent).select_related("owner", "queue")
    if state in JobState.values:
        rows = rows.filter(state=state)
    else:
        state = ""
    if after.isdigit():
        rows = rows.filter(array_index__gt=int(after))
    page = list(rows.order_by("array_index")[: ELEMENTS_PAGE + 1])
    counts = (parent.array_counts or {}).get("states", {})
    return {
        "job": parent,
        "elements": page[:ELEMENTS_PAGE],
        "element_state": state,
        "element_counts": sorted(counts.items()),
        "next_after": page[ELEMENTS_PAGE - 1].array_index if len(page) > ELEMENTS_PAGE else None,
    }
