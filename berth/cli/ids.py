"""Job ids as users type them: `123` (a job) or `123_4` (element 4 of array 123, Slurm's
spelling). One parser for every command: `int()` would read `4_0` as 40 and ` +5` as 5, and
the command would act on another job. Anything that is not one of these two spellings, in
ASCII digits without leading zeros, is a usage error (exit 2) before any request is made."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import click

from berth.cli.client import Client, CliError

# 18 digits stay below the database's largest id (2**63 - 1); ASCII only, no signs, spaces,
# leading zeros or digit-group underscores, so that every accepted text names one job.
_NUMBER = r"(?:0|[1-9][0-9]{0,17})"
_JOB = re.compile(rf"(?P<job>{_NUMBER})(?:_(?P<index>{_NUMBER}))?", re.ASCII)
SPELLING = "a job id (123) or an array element (123_4), in digits"


@dataclass(frozen=True)
class JobRef:
    """A job named on the command line: `job` alone, or element `index` of array `job`."""

    job: int
    index: int | None = None

    def __str__(self) -> str:
        return str(self.job) if self.index is None else f"{self.job}_{self.index}"


def parse_job_ref(text: str, *, elements: bool = True) -> JobRef:
    """`text` as a JobRef; ValueError naming what was wrong for anything else."""
    match = _JOB.fullmatch(text)
    if match is None or (match["index"] is not None and not elements):
        want = SPELLING if elements else "an id in digits (123)"
        raise ValueError(f"{text!r} is not {want}")
    index = match["index"]
    return JobRef(int(match["job"]), None if index is None else int(index))


class JobIdType(click.ParamType):
    """A click argument type: `123` or `123_4` (elements=False: `123` only, for flows)."""

    name = "job_id"

    def __init__(self, elements: bool = True) -> None:
        self.elements = elements

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, JobRef):
            return value
        try:
            ref = parse_job_ref(str(value), elements=self.elements)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return ref if self.elements else ref.job


JOB_ID = JobIdType()
FLOW_ID = JobIdType(elements=False)


def resolve(api: Client, ref: JobRef) -> int:
    """The job's id: `ref.job` itself, or the id of element `ref.index` of array `ref.job`,
    asked of the server (`GET /jobs/?array=P&index=I`) and checked, so that nothing but that
    element is ever acted on."""
    if ref.index is None:
        return ref.job
    rows = api.get("jobs/", array=ref.job, index=ref.index)
    rows = rows.get("results", []) if isinstance(rows, dict) else rows
    found = [r for r in rows if r.get("array_parent") == ref.job
             and r.get("array_index") == ref.index]  # fmt: skip
    if len(found) != 1:
        raise CliError(f"job {ref}: no such array element (job {ref.job} is not an array "
                       f"you can see, or has no element {ref.index})")  # fmt: skip
    return int(found[0]["id"])
