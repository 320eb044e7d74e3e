"""The pages. One function view per page; an htmx request gets only the fragment."""

from __future__ import annotations

from typing import Any

import yaml
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard import queries
from dashboard.arrays import element_page
from scheduler.flows.rerun import resubmit_flow, retry_flow
from scheduler.intake.inputs import BadInput, load_yaml
from scheduler.intake.specs import SpecError
from scheduler.jobs import operations, terminals
from scheduler.jobs.logs import parse_attempt
from scheduler.jobs.submit import create_flow, submit_job
from scheduler.models import Flow, Job, JobTemplate, Node, Queue, Task
from scheduler.states.names import JobState

PAGE = 50


def _htmx(request: HttpRequest) -> bool:
    """Is this an htmx request? (django-htmx's middleware sets request.htmx)"""
    return bool(getattr(request, "htmx", False))


def _job_for_user(request: HttpRequest, job_id: int) -> Job:
    """The job if the user may see it; 404 otherwise (never 403: nothing leaks)."""
    jobs = Job.objects.visible_to(request.user).select_related("owner", "queue", "flow", "step")
    return get_object_or_404(jobs, pk=job_id)


def _flow_for_user(request: HttpRequest, flow_id: int) -> Flow:
    return get_object_or_404(Flow.objects.visible_to(request.user).select_related("owner"),
                             pk=flow_id)  # fmt: skip


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    context = {"cards": queries.node_cards(), "summary": queries.cluster_summary()}
    return render(request, "dashboard/cluster.html", context)


@login_required
def jobs(request: HttpRequest) -> HttpResponse:
    """Newest first, keyset-paginated by id so a page costs the same at 100,000 jobs."""
    rows = Job.objects.visible_to(request.user).select_related("owner", "queue", "flow")
    filters = {k: request.GET.get(k, "").strip() for k in ("state", "queue", "owner", "flow", "q")}
    if filters["state"]:
        rows = rows.filter(state=filters["state"])
    if filters["queue"]:
        rows = rows.filter(queue__name=filters["queue"])
    if filters["owner"]:
        rows = rows.filter(owner__username=filters["owner"])
    if filters["flow"].isdigit():
        rows = rows.filter(flow_id=int(filters["flow"]))
    if filters["q"]:
        q = filters["q"]
        rows = rows.filter(pk=int(q)) if q.isdigit() else rows.filter(name__icontains=q)
    if not filters["q"].isdigit():  # an array is one row (its parent); an id finds any job
        rows = rows.filter(array_parent__isnull=True)
    before = request.GET.get("before", "")
    if before.isdigit():
        rows = rows.filter(pk__lt=int(before))
    page = list(rows.order_by("-id")[: PAGE + 1])
    context = {
        "jobs": page[:PAGE], "filters": filters, "states": JobState.values,
        "queues": Queue.objects.values_list("name", flat=True),
        "next_before": page[PAGE - 1].pk if len(page) > PAGE else None, "before": before,
        "live_new": not before and not any(filters.values()),  # new jobs pushed go on top
    }  # fmt: skip
    template = "dashboard/jobs.html#jobs-table" if _htmx(request) else "dashboard/jobs.html"
    return render(request, template, context)


@login_required
def job(request: HttpRequest, job_id: int) -> HttpResponse:
    the_job = _job_for_user(request, job_id)
    context = queries.job_detail(the_job)
    _pick_attempt(context["tasks"], request.GET)  # the attempt picker without JavaScript
    if the_job.is_array:
        context.update(element_page(the_job, request.GET))
    # Its GPUs' utilisation is charted (static/berth/gpu-chart.js polls the API).
    context["uses_gpus"] = any(t.gpu for t in context["tasks"])
    # A terminal in it (docs/interactive.md): its owner's, or staff's where its queue allows.
    context["can_shell"] = (the_job.state == JobState.RUNNING and not the_job.is_array
                            and terminals.may_open(the_job, request.user))  # fmt: skip
    return render(request, "dashboard/job.html", context)


def _attempt_of(task: Task, raw: str) -> int:
    """The attempt asked for (`raw`), or 404 when the task has no such attempt."""
    attempt = parse_attempt(raw, task.attempt)
    if attempt is None:
        raise Http404("no such attempt")
    return attempt


def _pick_attempt(tasks: list[Task], params: Any) -> None:
    task_id, raw = params.get("task", ""), params.get("attempt", "")
    for task in tasks:
        if raw and str(task.pk) == task_id:
            queries.show_log(task, _attempt_of(task, raw))


@login_required
def job_task_log(request: HttpRequest, job_id: int, task_id: int) -> HttpResponse:
    """One task's output pane showing the attempt picked (the picker's htmx fragment)."""
    the_job = _job_for_user(request, job_id)
    task = get_object_or_404(Task, pk=task_id, job=the_job)
    raw = request.GET.get("attempt", "") or str(task.attempt)
    queries.show_log(task, _attempt_of(task, raw))
    context = {"job": the_job, "t": task, "tail_chars": queries.LOG_TAIL_CHARS}
    return render(request, "dashboard/job.html#task-log", context)


@login_required
def job_elements(request: HttpRequest, job_id: int) -> HttpResponse:
    """An array's elements, a page at a time: the jobs list's expanded row (htmx fragment)."""
    parent = _job_for_user(request, job_id)
    if not parent.is_array:
        raise Http404("not an array")
    if request.GET.get("collapsed"):
        return render(request, "dashboard/jobs.html#array-collapsed", {"job": parent})
    context = element_page(parent, request.GET)
    if request.GET.get("panel"):  # a state filter or the next page, inside the open panel
        return render(request, "dashboard/jobs.html#array-panel", context)
    return render(request, "dashboard/jobs.html#array-elements", context)


@login_required
@require_POST
def job_action(request: HttpRequest, job_id: int, action: str) -> HttpResponse:
    the_job = _job_for_user(request, job_id)
    if action not in ("cancel", "suspend", "resume", "resubmit"):
        raise PermissionDenied(f"unknown action {action}")
    error = ""
    try:
        if action == "resubmit":
            new = operations.resubmit_job(the_job, request.user)
            return _go(request, reverse("dashboard:job", args=[new.pk]))
        operations.request_job_action(the_job, action, request.user)
    except operations.OperationError as exc:
        error = str(exc)
    except SpecError as exc:  # the old spec is no longer accepted (queue gone, priority cap)
        error = f"cannot resubmit: {exc}"
    context = queries.job_detail(_job_for_user(request, job_id))
    context["action_error"] = error
    if _htmx(request):
        return render(request, "dashboard/job.html#job-header", context)
    return redirect("dashboard:job", job_id=job_id)


@login_required
def flows(request: HttpRequest) -> HttpResponse:
    """The newest 200 flows with their job counts (one grouped query over their jobs)."""
    rows = list(Flow.objects.visible_to(request.user).select_related("owner").order_by("-id")[:200])
    queries.count_flow_jobs(rows)
    return render(request, "dashboard/flows.html", {"flows": rows})


@login_required
def flow(request: HttpRequest, flow_id: int) -> HttpResponse:
    context = queries.flow_detail(_flow_for_user(request, flow_id), with_logs=True)
    return render(request, "dashboard/flow.html", context)


@login_required
@require_POST
def flow_cancel(request: HttpRequest, flow_id: int) -> HttpResponse:
    the_flow = _flow_for_user(request, flow_id)
    try:
        operations.request_flow_cancel(the_flow, request.user)
    except operations.OperationError:
        pass
    return _go(request, reverse("dashboard:flow", args=[flow_id]))


@login_required
@require_POST
def flow_retry(request: HttpRequest, flow_id: int) -> HttpResponse:
    """Run a failed flow's failed and skipped steps again; the page says why it cannot."""
    the_flow = _flow_for_user(request, flow_id)
    try:
        retry_flow(the_flow, request.user)
    except operations.OperationError as exc:
        return _flow_error(request, the_flow, str(exc))
    return _go(request, reverse("dashboard:flow", args=[flow_id]))


@login_required
@require_POST
def flow_resubmit(request: HttpRequest, flow_id: int) -> HttpResponse:
    """A new flow from this one's spec (still its owner's); opens the new flow."""
    the_flow = _flow_for_user(request, flow_id)
    try:
        new = resubmit_flow(the_flow, request.user)
    except SpecError as exc:  # the old spec is no longer accepted (queue gone, priority cap)
        return _flow_error(request, the_flow, f"cannot resubmit: {exc}")
    return _go(request, reverse("dashboard:flow", args=[new.pk]))


def _flow_error(request: HttpRequest, the_flow: Flow, error: str) -> HttpResponse:
    context = queries.flow_detail(the_flow, with_logs=not _htmx(request))
    context["action_error"] = error
    template = "dashboard/flow.html#flow-live" if _htmx(request) else "dashboard/flow.html"
    return render(request, template, context)


@login_required
def queues(request: HttpRequest) -> HttpResponse:
    context = {"summary": queries.cluster_summary(), "rules": queries.queue_rules(),
               "node_ids": Node.objects.values_list("pk", flat=True)}  # fmt: skip
    return render(request, "dashboard/queues.html", context)


@login_required
def nodes(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/nodes.html", {"cards": queries.node_cards()})


@login_required
def node(request: HttpRequest, name: str) -> HttpResponse:
    """One node: its card (live) and each GPU's utilisation and memory over the last hour."""
    the_node = get_object_or_404(Node, name=name)
    card = queries.node_cards([the_node.pk])[0]
    return render(request, "dashboard/node.html", {"card": card, "node": the_node})


@login_required
@require_POST
def node_action(request: HttpRequest, name: str, action: str) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("only staff may cordon, uncordon or drain nodes")
    actions = {"cordon": operations.cordon_node, "uncordon": operations.uncordon_node,
               "drain": operations.drain_node}  # fmt: skip
    if action not in actions:
        raise PermissionDenied(f"unknown action {action}")
    node = actions[action](get_object_or_404(Node, name=name), request.user)
    if _htmx(request):  # the card swaps itself in place (out of band); the push follows
        card = queries.node_cards([node.pk])[0]
        return render(request, "dashboard/cluster.html#node-card", {"card": card, "oob": True})
    return redirect("dashboard:nodes")


def _go(request: HttpRequest, url: str) -> HttpResponse:
    if _htmx(request):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = url
        return response
    return redirect(url)


def _prefill(kind: str, template: JobTemplate | None) -> str:
    if kind == "flow":
        step = template.name if template else "my-template"
        spec: dict[str, Any] = {"name": "my-sweep", "parallelism": 2, "fail_fast": True,
                                "steps": [{"name": "train", "template": step,
                                           "items": [{"LR": "0.1"}, {"LR": "0.01"}]}]}  # fmt: skip
    elif template is not None:
        spec = {"name": template.name, **template.spec}
    else:
        spec = {"name": "hello", "tasks": [{"name": "main", "command": "echo hello; sleep 5",
                                            "resources": {"cpu": 1, "memory": "1Gi"}}]}  # fmt: skip
    return yaml.safe_dump(spec, sort_keys=False)


@login_required
def submit(request: HttpRequest) -> HttpResponse:
    kind = request.POST.get("kind") or request.GET.get("kind") or "job"
    kind = "flow" if kind == "flow" else "job"
    templates = JobTemplate.objects.order_by("name")
    errors: dict[str, list[str]] = {}
    text = ""
    if request.method == "POST":
        text = request.POST.get("spec", "")
        try:  # the API's bounds: no aliases, bounded depth, storable text
            data = load_yaml(text)
        except BadInput as exc:
            errors = {("yaml" if p == "body" else p): m for p, m in exc.errors.items()}
        else:
            try:
                if kind == "flow":
                    new_flow = create_flow(request.user, data)
                    return _go(request, reverse("dashboard:flow", args=[new_flow.pk]))
                new_job = submit_job(request.user, data)
                return _go(request, reverse("dashboard:job", args=[new_job.pk]))
            except SpecError as exc:
                errors = exc.errors
    else:
        chosen = templates.filter(name=request.GET.get("template", "")).first()
        text = _prefill(kind, chosen)
    context = {"kind": kind, "templates": templates, "text": text, "errors": errors,
               "chosen": request.GET.get("template", "")}  # fmt: skip
    if _htmx(request):
        # htmx swaps only 2xx responses: the form comes back with its errors inline.
        return render(request, "dashboard/submit.html#submit-form", context)
    return render(request, "dashboard/submit.html", context, status=400 if errors else 200)
