"""Create jobs, flows and templates from specs, atomically: all of it or nothing."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from django.db import models, transaction
from django.db.models import Count, Max, Q, QuerySet

from scheduler import notify
from scheduler.core.fit import Ask, Offer, never_fits, over_capability
from scheduler.core.quantity import parse_cpu, parse_gpu_field, parse_memory
from scheduler.core.resources import Resources
from scheduler.intake.arrayspec import parse_array
from scheduler.intake.specs import (
    SpecError,
    array_max_elements,
    normalize_flow_spec,
    normalize_job_spec,
    normalize_template_spec,
    step_job_spec,
    with_queue_defaults,
)
from scheduler.jobs.arrays import submit_array
from scheduler.jobs.events import record
from scheduler.models import (
    Allocation,
    Event,
    Flow,
    FlowStep,
    Job,
    JobTemplate,
    MigInstance,
    Node,
    Queue,
    Task,
    capability_problems,
    sharing_problems,
)
from scheduler.sql import advisory_xact_lock, row_by, write_job
from scheduler.states.codes import EventKind, Reason
from scheduler.states.names import JobState

M = TypeVar("M", bound=models.Model)


def submit_job(
    owner: Any,
    data: object,
    *,
    flow: Flow | None = None,
    step: FlowStep | None = None,
    item_index: int | None = None,
    template: JobTemplate | None = None,
    hold_reason: str = "",
    requested_by: Any = None,
    lower_priority_to_cap: bool = False,
) -> Job:
    """Validate `data` and create the job with one task row per replica.

    The priority policy is that of `requested_by` (default: the owner): a non-staff user's
    priority above the queue's `max_user_priority` is refused, or, with
    `lower_priority_to_cap` (a flow step's job, whose priority came from a template), lowered
    to the cap with an event saying so.
    """
    policy_user = requested_by if requested_by is not None else owner
    # A flow's steps were checked against the nodes when the flow was submitted.
    spec, queue, lowered = _checked(data, policy_user, lower_priority_to_cap, flow is None)
    labels = _job_labels(spec, flow, template, step)
    if "array" in spec and flow is not None:
        raise SpecError({"array": ["not in a flow step: a step fans out with items"]})
    # A flow's own jobs are not held to the pending limit: the flow was accepted whole.
    limited = flow is None and queue.max_user_pending_jobs is not None
    with pending_limit(owner, queue, _elements(spec) if limited else 0):
        if "array" in spec:
            return submit_array(owner, spec, queue, labels)
        job = _write_new_job(owner, spec, queue, labels, lowered,
                             flow=flow, step=step, item_index=item_index, template=template,
                             hold_reason=hold_reason)  # fmt: skip
    notify.changed(jobs=[job.pk], flows=[flow.pk] if flow else [])
    return job


def _elements(spec: dict[str, Any]) -> int:
    """How many jobs the spec makes: an array's elements, else one."""
    if "array" not in spec:
        return 1
    return len(parse_array(spec["array"], array_max_elements()).indices)


@contextmanager
def pending_limit(owner: Any, queue: Queue, adding: int) -> Iterator[None]:
    """Refuse (SpecError, nothing written) a submission that would take `owner` past the
    queue's `max_user_pending_jobs`; else run the block in one transaction holding a lock
    per (user, queue) until it commits, so two racing submissions cannot both pass. No
    statement at all where the queue sets no limit (or exempts the owner)."""
    limit = queue.max_user_pending_jobs
    exempt = queue.user_limits_exempt_staff and getattr(owner, "is_staff", False)
    if limit is None or exempt or adding <= 0:
        yield
        return
    with transaction.atomic():
        advisory_xact_lock(queue.pk, owner.pk)  # released at commit or rollback
        waiting = Job.objects.filter(owner=owner, queue=queue, state=JobState.PENDING)
        count = waiting.filter(array_size__isnull=True).count()
        if count + adding > limit:
            raise SpecError({"queue": [
                f'max_user_pending_jobs of queue "{queue.name}" is {limit}: you have {count}'
                f" pending there and this submission adds {adding}"
            ]})  # fmt: skip
        yield


def _write_new_job(
    owner: Any, spec: dict[str, Any], queue: Queue, labels: dict[str, str], lowered: str,
    **links: Any,
) -> Job:  # fmt: skip
    """Insert one job, its tasks and its submission events (scheduler/sql.py, write_job)."""
    job = Job(**_job_fields(spec), owner=owner, queue=queue, labels=labels, **links)
    tasks = _new_tasks(job, spec)
    events = [_event(job, EventKind.JOB_SUBMITTED, Reason.SUBMITTED,
                     f"{len(tasks)} tasks in queue {queue.name}")]  # fmt: skip
    if lowered:
        events.append(_event(job, EventKind.PRIORITY_LOWERED, Reason.PRIORITY_POLICY, lowered))
    write_job(job, tasks, events)  # one statement, atomic (scheduler/sql.py, write_job)
    _created_with(job, tasks)
    return job


def _checked(
    data: object, policy_user: Any, lower_to_cap: bool, check_fits: bool
) -> tuple[dict[str, Any], Queue, str]:
    """`data` as a normalized spec with its queue's defaults, its queue, and what the event
    about a lowered priority says ("" if none); SpecError for anything not acceptable."""
    spec = normalize_job_spec(data)
    queue = row_by(Queue, "name", spec["queue"])
    if queue is None:
        raise SpecError({"queue": [f'unknown queue "{spec["queue"]}"']})
    spec = with_queue_defaults(spec, queue.default_cpu, queue.default_memory)
    _walltime_policy(spec, queue)
    lowered = _priority_policy(spec, queue, policy_user, lower_to_cap)
    if check_fits:
        refuse_never_fits(spec, queue)
    return spec, queue, lowered


def _walltime_policy(spec: dict[str, Any], queue: Queue) -> None:
    """A walltime above the queue's `max_walltime` is refused; none gets that maximum."""
    most = queue.max_walltime
    if most is None:
        return
    if spec.get("walltime") is None:
        spec["walltime"] = most
    elif spec["walltime"] > most:
        raise SpecError({"walltime": [
            f'at most {most} s in queue "{queue.name}" (its max_walltime), got {spec["walltime"]}'
        ]})  # fmt: skip


def _priority_policy(spec: dict[str, Any], queue: Queue, user: Any, lower_to_cap: bool) -> str:
    """Refuse a priority above what `user` may ask for in `queue`, or with `lower_to_cap`
    lower `spec`'s to the cap and return what the event about it says ("" if unchanged)."""
    refusal = queue.priority_refusal(user, spec["priority"])
    if not refusal:
        return ""
    if not lower_to_cap:
        raise SpecError({"priority": [refusal]})
    wanted, spec["priority"] = spec["priority"], queue.priority_cap_for(user)
    return f"priority {wanted} lowered to {spec['priority']}: {refusal}"


def _event(job: Job, kind: str, reason: str, message: str) -> Event:
    """An unsaved event of `job` (scheduler/jobs/events.py's `record`, written with the job)."""
    return Event(kind=kind, reason=reason, message=message, job=job, flow_id=job.flow_id)


def _job_labels(
    spec: dict[str, Any], flow: Flow | None, template: JobTemplate | None, step: FlowStep | None
) -> dict[str, str]:
    """The spec's labels, and where the job came from (its flow, template and step)."""
    labels = dict(spec["labels"])
    if flow is not None:
        labels["berth/flow"] = str(flow.pk)
    if template is not None:
        labels["berth/template"] = template.name
    if step is not None:
        labels["berth/step"] = step.name
    return labels


def _job_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """The job row's fields that come straight from its normalized spec."""
    names = ("name", "priority", "preemptible", "min_available", "walltime",
             "ttl_seconds_after_finished", "active_deadline_seconds", "max_retry")  # fmt: skip
    return {"spec": spec, **{name: spec[name] for name in names}}


def _new_tasks(job: Job, spec: dict[str, Any]) -> list[Task]:
    """One unsaved task row per replica of each task group of `spec`."""
    tasks = []
    for group in spec["tasks"]:
        resources = group["resources"]
        for index in range(group["replicas"]):
            tasks.append(
                Task(
                    job=job,
                    group=group["name"],
                    index=index,
                    cpu=parse_cpu(resources["cpu"]),
                    memory=parse_memory(resources["memory"]),
                    **_gpu_fields(resources),
                )
            )
    return tasks


def _gpu_fields(resources: dict[str, Any]) -> dict[str, Any]:
    """A task row's GPU columns from a normalized spec's resources: whole devices, or one
    device's share (thousandths) and the GPU memory it asks for."""
    devices, share, profile = parse_gpu_field(resources["gpu"])
    memory = parse_memory(resources["gpu_memory"]) if "gpu_memory" in resources else 0
    return {"gpu": devices, "gpu_share": share, "gpu_memory": memory, "gpu_mig": profile}


def _created_with(job: Job, tasks: list[Task]) -> None:
    """Let `job.tasks.all()` (and each new task's allocations, none yet) answer from what was
    just written, as a prefetch would, so that the caller can show the new job without
    reading it back. A filter on them still queries the database."""
    for task in tasks:
        task._prefetched_objects_cache = {  # type: ignore[attr-defined]
            "allocations": _known(Allocation.objects.filter(task=task), [])
        }
    job._prefetched_objects_cache = {  # type: ignore[attr-defined]
        "tasks": _known(Task.objects.filter(job=job), tasks)
    }


def _known(queryset: QuerySet[M], rows: list[M]) -> QuerySet[M]:
    """`queryset` with `rows` as its result, as Django's prefetch leaves it."""
    queryset._result_cache = rows
    queryset._prefetch_done = True  # type: ignore[attr-defined]
    return queryset


def create_flow(owner: Any, data: object) -> Flow:
    """Validate `data` and create the flow and its steps; the flow controller makes jobs.

    Each step's job (its template or inline spec, then overrides, then its first item) is
    checked here too, so a flow that could never make a job is refused before anything is
    written."""
    spec = normalize_flow_spec(data)
    names = {s["template"] for s in spec["steps"] if "template" in s}
    templates = {t.name: t for t in JobTemplate.objects.filter(name__in=names)}
    errors = _step_errors(spec["steps"], templates)
    if errors:
        raise SpecError(errors)
    errors = _step_priority_refusals(owner, spec["steps"], templates)
    errors.update(_steps_never_fitting(spec["steps"], templates))
    if errors:
        raise SpecError(errors)
    with transaction.atomic():
        flow = Flow.objects.create(
            name=spec["name"],
            owner=owner,
            spec=spec,
            parallelism=spec["parallelism"],
            fail_fast=spec["fail_fast"],
            ttl_seconds_after_finished=spec["ttl_seconds_after_finished"],
        )
        FlowStep.objects.bulk_create(
            FlowStep(
                flow=flow,
                name=s["name"],
                position=i,
                template=templates[s["template"]] if "template" in s else None,
                spec=s.get("spec"),
                depends_on=s["depends_on"],
                overrides=s["overrides"],
                items=s["items"],
            )
            for i, s in enumerate(spec["steps"])
        )
        record(EventKind.FLOW_CREATED, Reason.CREATED, f"{len(spec['steps'])} steps", flow=flow)
        notify.changed(flows=[flow.pk])
    return flow


def registered_offers() -> list[Offer]:
    """Every registered node's allocatable (whatever its state: a node down for a moment
    still counts), in one query."""
    rows = Node.objects.order_by("name").annotate(
        # (a GPU in MIG mode is no whole GPU: only its instances are offered)
        gpus=Count("devices", distinct=True, filter=Q(devices__mig_instances__isnull=True)),
        gpu_memory=Max("devices__memory", filter=Q(devices__mig_instances__isnull=True)),
    )
    return [
        Offer(
            name,
            Resources(cpu, memory, gpus),
            labels if isinstance(labels, dict) else {},
            tuple(modes) if isinstance(modes, list) and not sharing_problems(modes) else (),
            gpu_memory or 0,
        )
        for name, cpu, memory, gpus, labels, modes, gpu_memory in rows.values_list(
            "name", "cpu", "memory", "gpus", "labels", "gpu_sharing", "gpu_memory"
        )
    ]


def with_mig_instances(offers: list[Offer]) -> list[Offer]:
    """`offers` with each node's MIG instances per profile (one query, asked only for a job
    asking for a MIG profile)."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    rows = MigInstance.objects.values_list("device__node__name", "profile").annotate(n=Count("id"))
    for name, profile, count in rows.order_by():
        counts[name][profile] = count
    return [replace(o, mig=counts.get(o.name, {})) for o in offers]


def _queue_modes(queue: Queue | None) -> tuple[str, ...]:
    """The GPU sharing modes the queue allows its fractions (empty: any)."""
    modes = queue.gpu_sharing if queue is not None else None
    if not isinstance(modes, list) or sharing_problems(modes):
        return ()
    return tuple(modes) or ("none",)


def never_fit_errors(
    spec: dict[str, Any], offers: list[Offer], queue: Queue | None = None
) -> dict[str, str]:
    """A normalized job spec's never-fits problems on `offers` and in `queue`
    (scheduler/core/fit.py)."""
    asks = [
        Ask(
            path=f"tasks.{i}",
            group=task["name"],
            resources=Resources.parse(task["resources"]),
            replicas=task["replicas"],
            node_selector=task["node_selector"],
            gpu_share=_gpu_fields(task["resources"])["gpu_share"],
            gpu_memory=_gpu_fields(task["resources"])["gpu_memory"],
            gpu_modes=_queue_modes(queue),
            gpu_mig=_gpu_fields(task["resources"])["gpu_mig"],
        )
        for i, task in enumerate(spec["tasks"])
    ]
    if any(ask.gpu_mig for ask in asks):
        offers = with_mig_instances(offers)
    problems = never_fits(asks, spec["min_available"], offers)
    if queue is not None and isinstance(queue.capability, dict):
        if not capability_problems(queue.capability):
            problems.update(
                over_capability(asks, spec["min_available"], queue.capability, queue.name)
            )
    return problems


# The registered nodes' capacities, read at most once a second per process to accept jobs
# (every submission checks its job could ever fit). Only an acceptance uses them: a job they
# refuse is checked again on a fresh read, so a node that just joined never causes a 400.
# A node forgotten in the last second may let through a job that then waits with a reason;
# no node at all is never remembered (a first node must refuse what it can never run).
# One thread of a process reads them again when they are due; the others wait for its read.
OFFERS_MAX_AGE = 1.0
_recent_offers: tuple[float, list[Offer]] = (-OFFERS_MAX_AGE, [])
_offers_lock = threading.Lock()


def forget_recent_offers() -> None:
    """The next never-fits check reads the nodes afresh (tests, after changing nodes)."""
    global _recent_offers
    _recent_offers = (-OFFERS_MAX_AGE, [])


def _read_offers() -> list[Offer]:
    global _recent_offers
    read_at, offers = time.monotonic(), registered_offers()
    _recent_offers = (read_at, offers)
    return offers


def _recent() -> list[Offer]:
    read_at, offers = _recent_offers
    return offers if time.monotonic() - read_at < OFFERS_MAX_AGE else []


def _offers_to_accept() -> list[Offer]:
    """The nodes' capacities, up to OFFERS_MAX_AGE old, to accept a job on."""
    if offers := _recent():
        return offers
    if not _recent_offers[1]:
        return _read_offers()  # no node: nothing worth waiting for another thread's read
    with _offers_lock:
        return _recent() or _read_offers()


def refuse_never_fits(spec: dict[str, Any], queue: Queue | None = None) -> None:
    """400 when no registered node could ever run the job (none registered: accept), or its
    gang needs more than its queue may ever hold."""
    if not never_fit_errors(spec, _offers_to_accept(), queue):
        return
    problems = never_fit_errors(spec, _read_offers(), queue)
    if problems:
        raise SpecError({path: [message] for path, message in problems.items()})


def _steps_never_fitting(
    steps: list[dict[str, Any]], templates: dict[str, JobTemplate]
) -> dict[str, list[str]]:
    """Each step whose job (template, overrides, first item) could never run here."""
    offers = registered_offers()
    queues = {q.name: q for q in Queue.objects.all()}
    errors: dict[str, list[str]] = {}
    for i, step in enumerate(steps):
        item = step["items"][0] if step["items"] else None
        inline = "template" not in step
        base = step["spec"] if inline else templates[step["template"]].spec
        try:
            spec = step_job_spec(base, step["overrides"], item, name="check")
        except SpecError:
            continue  # reported by _step_job_errors
        queue = queues.get(spec["queue"])
        if queue is not None:  # sized as the controller will make it: the queue's defaults
            spec = with_queue_defaults(spec, queue.default_cpu, queue.default_memory)
        prefix = f"steps.{i}.spec." if inline else f"steps.{i}."
        for path, message in never_fit_errors(spec, offers, queue).items():
            errors[prefix + path] = [message]
    return errors


def _step_errors(
    steps: list[dict[str, Any]], templates: dict[str, JobTemplate]
) -> dict[str, list[str]]:
    """What is wrong with each step's job: an unknown template or queue, or a spec (template
    or inline, then overrides, then the first item) that makes no valid job."""
    errors: dict[str, list[str]] = {}
    queues = set(Queue.objects.values_list("name", flat=True))
    for i, step in enumerate(steps):
        template = templates.get(step["template"]) if "template" in step else None
        if "template" in step and template is None:
            errors[f"steps.{i}.template"] = [f'unknown template "{step["template"]}"']
            continue
        for path, messages in _step_job_errors(template, step).items():
            errors.setdefault(f"steps.{i}.{path}", []).extend(messages)
        base = template.spec if template is not None else step["spec"]
        if not isinstance(base, dict):
            continue
        queue = step["overrides"].get("queue") or base.get("queue", "default")
        if queue not in queues:
            where = "overrides.queue" if "queue" in step["overrides"] else (
                "template" if template is not None else "spec.queue")  # fmt: skip
            errors.setdefault(f"steps.{i}.{where}", []).append(f'unknown queue "{queue}"')
    return errors


def _step_priority_refusals(
    owner: Any, steps: list[dict[str, Any]], templates: dict[str, JobTemplate]
) -> dict[str, list[str]]:
    """Each step whose job would have a priority above what `owner` may ask for in its queue.

    A step's job takes its queue and priority from the template (or its inline spec), then the
    step's overrides. A step whose values are not valid is left to the flow controller, which
    fails the step.
    """
    wanted: list[tuple[int, str, int, str]] = []
    for i, step in enumerate(steps):
        template = templates.get(step["template"]) if "template" in step else None
        base = template.spec if template is not None else step["spec"]
        overrides = step["overrides"]
        queue = overrides.get("queue", base.get("queue", "default"))
        if "priority" in overrides:
            priority, source = overrides["priority"], "overrides.priority"
        elif template is not None:
            priority = template.spec.get("priority", 0)
            source = f'template "{template.name}"; lower it with overrides.priority'
        else:
            priority, source = base.get("priority", 0), ""
        if isinstance(queue, str) and isinstance(priority, int) and not isinstance(priority, bool):
            wanted.append((i, queue, priority, source))
    queues = {q.name: q for q in Queue.objects.filter(name__in={w[1] for w in wanted})}
    errors: dict[str, list[str]] = {}
    for i, queue_name, priority, source in wanted:
        queue = queues.get(queue_name)
        refusal = queue.priority_refusal(owner, priority) if queue else ""
        if refusal and source:
            errors[f"steps.{i}.priority"] = [f"{refusal} (from {source})"]
        elif refusal:  # the step's own spec asks for it
            errors[f"steps.{i}.spec.priority"] = [refusal]
    return errors


def _step_job_errors(template: JobTemplate | None, step: dict[str, Any]) -> dict[str, list[str]]:
    """What is wrong with the job a flow step would make, keyed under the step: a field the
    step overrides is named under `overrides`, the rest is the template's (or spec's) fault."""
    if template is not None and not isinstance(template.spec, dict):
        return {"template": [f'template "{template.name}" has no job spec']}
    base = template.spec if template is not None else step["spec"]
    item = step["items"][0] if step["items"] else None
    try:
        step_job_spec(base, step["overrides"], item, name="check")
    except SpecError as exc:
        out: dict[str, list[str]] = {}
        for path, messages in exc.errors.items():
            parts = path.split(".")
            field = parts[2] if parts[0] == "tasks" and len(parts) > 2 else parts[0]
            if field in step["overrides"]:
                key = "overrides." + (".".join(parts[2:]) if parts[0] == "tasks" else path)
                out.setdefault(key, []).extend(messages)
            elif template is not None:
                out.setdefault("template", []).extend(
                    f'template "{template.name}" makes no valid job: {path} {m}' for m in messages
                )
            else:
                out.setdefault(f"spec.{path}", []).extend(messages)
        return out
    return {}


def create_template(owner: Any, data: object) -> JobTemplate:
    """Validate `data` (`{"name", "description", "spec"}`) and create the template."""
    spec = normalize_template_spec(data)
    if JobTemplate.objects.filter(name=spec["name"]).exists():
        raise SpecError({"name": [f'a template named "{spec["name"]}" exists already']})
    _check_queue(spec["spec"]["queue"], "spec.queue")
    return JobTemplate.objects.create(
        name=spec["name"], description=spec["description"], spec=spec["spec"], owner=owner
    )


def update_template(template: JobTemplate, data: object) -> JobTemplate:
    """Replace the template's description and spec; its name stays (flows refer to it)."""
    spec = normalize_template_spec(data)
    if spec["name"] != template.name:
        raise SpecError({"name": ["cannot be changed; create a new template instead"]})
    _check_queue(spec["spec"]["queue"], "spec.queue")
    template.description = spec["description"]
    template.spec = spec["spec"]
    template.save(update_fields=["description", "spec", "updated_at"])
    return template


def _check_queue(name: str, path: str) -> None:
    if not Queue.objects.filter(name=name).exists():
        raise SpecError({path: [f'unknown queue "{name}"']})
