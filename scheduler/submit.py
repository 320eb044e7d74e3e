"""Create jobs, flows and templates from specs, atomically: all of it or nothing."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from scheduler import notify
from scheduler.arrays import submit_array
from scheduler.core.quantity import parse_cpu, parse_gpu, parse_memory
from scheduler.events import record
from scheduler.models import Flow, FlowStep, Job, JobTemplate, Queue, Task
from scheduler.specs import (
    SpecError,
    normalize_flow_spec,
    normalize_job_spec,
    normalize_template_spec,
)


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
    spec = normalize_job_spec(data)
    queue = Queue.objects.filter(name=spec["queue"]).first()
    if queue is None:
        raise SpecError({"queue": [f'unknown queue "{spec["queue"]}"']})
    policy_user = requested_by if requested_by is not None else owner
    refusal = queue.priority_refusal(policy_user, spec["priority"])
    lowered_from: int | None = None
    if refusal and lower_priority_to_cap:
        lowered_from, spec["priority"] = spec["priority"], queue.priority_cap_for(policy_user)
    elif refusal:
        raise SpecError({"priority": [refusal]})
    labels = dict(spec["labels"])
    if flow is not None:
        labels["berth/flow"] = str(flow.pk)
    if template is not None:
        labels["berth/template"] = template.name
    if step is not None:
        labels["berth/step"] = step.name
    if "array" in spec:
        if flow is not None:
            raise SpecError({"array": ["not in a flow step: a step fans out with items"]})
        return submit_array(owner, spec, queue, labels)
    with transaction.atomic():
        job = Job.objects.create(
            name=spec["name"],
            owner=owner,
            queue=queue,
            priority=spec["priority"],
            preemptible=spec["preemptible"],
            min_available=spec["min_available"],
            spec=spec,
            labels=labels,
            walltime=spec["walltime"],
            ttl_seconds_after_finished=spec["ttl_seconds_after_finished"],
            active_deadline_seconds=spec["active_deadline_seconds"],
            max_retry=spec["max_retry"],
            flow=flow,
            step=step,
            item_index=item_index,
            template=template,
            hold_reason=hold_reason,
        )
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
                        gpu=parse_gpu(resources["gpu"]),
                    )
                )
        Task.objects.bulk_create(tasks)
        record("JobSubmitted", "Submitted", f"{len(tasks)} tasks in queue {queue.name}", job=job)
        if lowered_from is not None:
            record("PriorityLowered", "PriorityPolicy",
                   f"priority {lowered_from} lowered to {job.priority}: {refusal}",
                   job=job)  # fmt: skip
        notify.changed(jobs=[job.pk], flows=[flow.pk] if flow else [])
    return job


def create_flow(owner: Any, data: object) -> Flow:
    """Validate `data` and create the flow and its steps; the flow controller makes jobs."""
    spec = normalize_flow_spec(data)
    names = {s["template"] for s in spec["steps"]}
    templates = {t.name: t for t in JobTemplate.objects.filter(name__in=names)}
    errors = {
        f"steps.{i}.template": [f'unknown template "{s["template"]}"']
        for i, s in enumerate(spec["steps"])
        if s["template"] not in templates
    }
    if errors:
        raise SpecError(errors)
    errors = _step_priority_refusals(owner, spec["steps"], templates)
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
                template=templates[s["template"]],
                depends_on=s["depends_on"],
                overrides=s["overrides"],
                items=s["items"],
            )
            for i, s in enumerate(spec["steps"])
        )
        record("FlowCreated", "Created", f"{len(spec['steps'])} steps", flow=flow)
        notify.changed(flows=[flow.pk])
    return flow


def _step_priority_refusals(
    owner: Any, steps: list[dict[str, Any]], templates: dict[str, JobTemplate]
) -> dict[str, list[str]]:
    """Each step whose job would have a priority above what `owner` may ask for in its queue.

    A step's job takes its queue and priority from the template, then the step's overrides.
    A step whose values are not valid is left to the flow controller, which fails the step.
    """
    wanted: list[tuple[int, str, int, str]] = []
    for i, step in enumerate(steps):
        template = templates[step["template"]]
        overrides = step["overrides"]
        queue = overrides.get("queue", template.spec.get("queue", "default"))
        if "priority" in overrides:
            priority, source = overrides["priority"], "overrides.priority"
        else:
            priority = template.spec.get("priority", 0)
            source = f'template "{template.name}"; lower it with overrides.priority'
        if isinstance(queue, str) and isinstance(priority, int) and not isinstance(priority, bool):
            wanted.append((i, queue, priority, source))
    queues = {q.name: q for q in Queue.objects.filter(name__in={w[1] for w in wanted})}
    errors: dict[str, list[str]] = {}
    for i, queue_name, priority, source in wanted:
        queue = queues.get(queue_name)
        refusal = queue.priority_refusal(owner, priority) if queue else ""
        if refusal:
            errors[f"steps.{i}.priority"] = [f"{refusal} (from {source})"]
    return errors


def save_template(owner: Any, data: object, instance: JobTemplate | None = None) -> JobTemplate:
    """Create a template, or replace `instance`'s description and spec."""
    spec = normalize_template_spec(data)
    if instance is None:
        if JobTemplate.objects.filter(name=spec["name"]).exists():
            raise SpecError({"name": [f'a template named "{spec["name"]}" exists already']})
        return JobTemplate.objects.create(
            name=spec["name"], description=spec["description"], spec=spec["spec"], owner=owner
        )
    if spec["name"] != instance.name:
        raise SpecError({"name": ["cannot be changed; create a new template instead"]})
    instance.description = spec["description"]
    instance.spec = spec["spec"]
    instance.save(update_fields=["description", "spec", "updated_at"])
    return instance
