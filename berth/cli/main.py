"""`berth`: the command line for Berth users, in the spirit of sbatch/squeue/scancel/sacct.

Configured by BERTH_URL and BERTH_TOKEN, or by `berth login URL`. Every listing takes --json.
Errors print the server's field messages and exit 1.
"""

from __future__ import annotations

import codecs
import getpass
import shlex
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import click
import httpx

from berth.cli.client import (
    API,
    ApiError,
    Client,
    CliError,
    Settings,
    api_error,
    load_settings,
    save_settings,
)
from berth.cli.ids import FLOW_ID, JOB_ID, JobRef, resolve
from berth.cli.output import emit_json, job_position, job_reason, job_start, memory_text, table
from berth.cli.specs import (
    apply_job_options,
    directives,
    is_script,
    job_from_options,
    load_spec_file,
    safe_name,
)
from berth.cli.terminal import attach as attach_terminal

JOB_FINAL = ("Succeeded", "Failed", "Cancelled")
FLOW_FINAL = ("Succeeded", "Failed", "Cancelled")
POLL_SECONDS = 1.0
# `berth shell` asks this often while its job has waited less than START_POLL_FOR seconds:
# on an idle cluster the job runs within a cycle or two, and the prompt should follow at once.
START_POLL_SECONDS, START_POLL_FOR = 0.2, 10.0


class BerthGroup(click.Group):
    """Turns CliError into a message on stderr and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as exc:
            fail(str(exc))


def fail(message: str) -> NoReturn:
    click.echo(f"berth: {message}" if "\n" not in message else f"berth: error\n{message}",
               err=True)  # fmt: skip
    sys.exit(1)


def client() -> Client:
    return Client(load_settings())


@click.group(cls=BerthGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="berth", prog_name="berth")
def cli() -> None:
    """Submit, watch and manage Berth jobs and flows from the terminal.

    Set BERTH_URL and BERTH_TOKEN, or run `berth login URL` once.
    """


# --- login ------------------------------------------------------------------------------


@cli.command()
@click.argument("url", required=False)
@click.option("--username", "-u", default=None, help="default: your login name")
def login(url: str | None, username: str | None) -> None:
    """Sign in: ask for your password, get an API token and keep it (mode 0600) in
    ~/.config/berth/config.json."""
    url = (url or _saved_url() or click.prompt("Server URL")).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise CliError(f"URL must start with http:// or https://, got {url!r}")
    username = username or click.prompt("Username", default=getpass.getuser())
    password = click.prompt("Password", hide_input=True)
    body = {"username": username, "password": password,
            "name": f"berth-cli@{socket.gethostname()}"[:100]}  # fmt: skip
    try:
        response = httpx.post(f"{url}{API}/tokens/", json=body, timeout=30)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {url}: {exc}") from None
    if response.status_code >= 400:
        raise api_error(response)
    token = response.json()["token"]
    path = save_settings(Settings(url=url, token=token, username=username))
    click.echo(f"Logged in to {url} as {username} (token kept in {path})")


def _saved_url() -> str:
    try:
        return load_settings().url
    except CliError:
        return ""


# --- jobs -------------------------------------------------------------------------------


JOB_OPTIONS = [
    click.option("--name", "-J", default=None, help="job name"),
    click.option("--queue", "-q", default=None, help="queue (default: the server's default)"),
    click.option(
        "--gpus",
        "-G",
        default=None,
        help="GPUs per task: 1, 2, ..., part of one GPU: 0.25, or a MIG instance: 1g.10gb",
    ),
    click.option(
        "--gpu-mem", default=None, help="GPU memory per task with part of a GPU: 10Gi, ..."
    ),
    click.option("--cpu", "-c", default=None, help='cores per task: 2, 0.5 or "500m"'),
    click.option("--mem", "-m", default=None, help="memory per task: 512Mi, 16Gi, ..."),
    click.option("--time", "-t", default=None, help="walltime: 90 (seconds), 1h30m, 01:30:00"),
    click.option("--array", "-a", default=None, help="job array: 0-99, 0-99%10 (10 at once)"),
    click.option("--priority", type=int, default=None, help="priority (capped by the queue)"),
    click.option(
        "--app",
        default=None,
        metavar="KIND",
        help="the job runs a web app, reached at /apps/JOB/ for me only: http (it sees paths"
        " without /apps/JOB) or jupyter (it keeps them); its port is $BERTH_APP_PORT",
    ),
    click.option(
        "--notify",
        default=None,
        metavar="EVENTS",
        help="notify me (email, webhook) on these events, comma-separated: begin, end,"
        " fail, time_limit_90, time_limit_80, time_limit_50, time_limit_10m, time_limit_1m;"
        " none: no"
        " notifications (default: my account's defaults)",
    ),
    click.option(
        "--notify-webhook",
        default=None,
        metavar="URL",
        help="this job's webhook (a host staff allow; signed with my secret)",
    ),
]


def job_options(fn: Any) -> Any:
    for option in reversed(JOB_OPTIONS):
        fn = option(fn)
    return fn


@cli.command()
@job_options
@click.option("--wait", "-W", is_flag=True, help="follow the job; exit with its exit status")
@click.option("--json", "as_json", is_flag=True, help="print the created job as JSON")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def submit(args: tuple[str, ...], wait: bool, as_json: bool, **options: Any) -> None:
    """Submit a job: a YAML/JSON spec FILE, a shell script with #BERTH option lines, or a
    command after `--`.

    \b
      berth submit job.yaml
      berth submit train.sh            # #BERTH --gpus 1 --time 2h lines at the top
      berth submit --gpus 1 --time 1h30m -- python train.py --lr 0.1
      berth submit --notify end,time_limit_80 -t 2h -- python train.py
      berth submit --app http -- 'python -m http.server $BERTH_APP_PORT'
    """
    if not args:
        raise click.UsageError("give a spec FILE, a script, or `-- COMMAND...`")
    spec = _job_spec(args, options)
    api = client()
    job = api.post("jobs/", spec)
    if as_json:
        emit_json(job)
    else:
        click.echo(f"Submitted job {job['id']}")
    if wait:
        sys.exit(_wait_for_job(api, int(job["id"]), quiet=as_json))


def _job_spec(args: tuple[str, ...], options: dict[str, Any]) -> dict[str, Any]:
    path = Path(args[0])
    if len(args) == 1 and path.is_file():
        text = path.read_text(errors="replace")
        if path.suffix in (".yaml", ".yml", ".json") or not is_script(text):
            if any(options.get(k) is not None for k in ("gpus", "gpu_mem", "cpu", "mem")):
                raise CliError("--gpus/--cpu/--mem apply to commands and scripts; "
                               "a spec file says its resources per task")  # fmt: skip
            return apply_job_options(load_spec_file(path), options)
        return job_from_options(text, {**_script_options(text, path), **_given(options)})
    # One argument is a shell command line as typed ('echo $HOME; sleep 2'); several are a
    # command and its arguments, quoted so that each reaches the program as it was given.
    command = args[0] if len(args) == 1 else shlex.join(args)
    return job_from_options(command, options)


def _script_options(text: str, path: Path) -> dict[str, Any]:
    """The script's #BERTH lines, read with the same options as the command line."""
    try:
        context = submit.make_context("#BERTH", [*directives(text), "--", "script"])
    except click.ClickException as exc:
        raise CliError(f"{path}: #BERTH line: {exc.format_message()}") from None
    if context.params["args"] != ("script",):
        raise CliError(f"{path}: #BERTH lines hold no command: {context.params['args'][:-1]}")
    found = {k: v for k, v in context.params.items() if k not in ("args", "wait", "as_json")}
    found["name"] = found.get("name") or safe_name(path.stem)
    return {k: v for k, v in found.items() if v is not None}


def _given(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


def _wait_for_job(api: Client, job_id: int, quiet: bool = False) -> int:
    """Poll until the job ends; its exit status: 0 if it succeeded, the failing task's exit
    code (or 1) if it failed, 1 if it was cancelled."""
    last = None
    while True:
        job = api.get(f"jobs/{job_id}/")
        if job["state"] != last and not quiet:
            why = job_reason(job)
            click.echo(f"job {job_id}: {job['state']}" + (f" ({why})" if why else ""), err=True)
            last = job["state"]
        if job["state"] in JOB_FINAL:
            return exit_status(job)
        time.sleep(POLL_SECONDS)


def exit_status(job: dict[str, Any]) -> int:
    if job["state"] == "Succeeded":
        return 0
    if job["state"] == "Failed":
        codes = [t.get("exit_code") for t in job.get("tasks", [])]
        failing = [c for c in codes if isinstance(c, int) and c != 0]
        return max(1, min(255, failing[0])) if failing else 1
    return 1


@cli.command()
@click.option("--all", "-a", "all_users", is_flag=True, help="every user's jobs you may see")
@click.option("--state", "-s", default=None, help="Pending, Running, Succeeded, ...")
@click.option("--user", "-u", default=None, help="this user's jobs")
@click.option("--queue", "-q", default=None)
@click.option("--limit", "-n", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def jobs(all_users: bool, state: str | None, user: str | None, queue: str | None, limit: int,
         as_json: bool) -> None:  # fmt: skip
    """List jobs (yours unless --all or --user), newest first."""
    api = client()
    owner = user if user or all_users else _me(api)
    rows = api.paged("jobs/", limit=limit, state=state, owner=owner, queue=queue,
                     ordering="-id")  # fmt: skip
    if as_json:
        emit_json(rows)
        return
    table(rows, [("ID", lambda j: j["id"]), ("NAME", lambda j: j["name"]),
                 ("USER", lambda j: j.get("owner")), ("QUEUE", lambda j: j.get("queue")),
                 ("STATE", lambda j: j["state"]), ("POS", job_position), ("START", job_start),
                 ("REASON", job_reason)], "no jobs")  # fmt: skip


def _me(api: Client) -> str:
    return api.settings.username or str(api.get("me/")["username"])


@cli.command()
@click.argument("job_ref", metavar="JOB_ID", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True)
def show(job_ref: JobRef, as_json: bool) -> None:
    """One job (ID, or ARRAY_INDEX for an array element: 4_0): its state, reason, tasks and
    where they run."""
    api = client()
    job = api.get(f"jobs/{resolve(api, job_ref)}/")
    if as_json:
        emit_json(job)
        return
    for key in ("id", "name", "owner", "queue", "priority", "state", "reason", "message",
                "walltime", "created_at", "started_at", "finished_at"):  # fmt: skip
        click.echo(f"{key:>12}: {job.get(key) if job.get(key) not in (None, '') else '-'}")
    if job.get("walltime_ends_at"):
        click.echo(f"{'remaining':>12}: {_remaining(job['walltime_ends_at'])}")
    if job.get("gpu_idle_since"):
        click.echo(f"{'gpu idle':>12}: GPUs held idle (below 1 %) since {job['gpu_idle_since']}")
    if job.get("idle_ends_at"):
        click.echo(f"{'idle':>12}: warned at {job['idle_warned_at']}: ends at {job['idle_ends_at']}"
                   " (GPUs idle, no terminal input) unless used first")  # fmt: skip
    if job.get("state") in ("Pending", "Suspended"):
        click.echo(f"{'position':>12}: {job_position(job) or '-'}")
        basis = job.get("estimate_basis")
        by = {"prediction": " (by runtime predictions)", "walltime": " (by walltimes)"}
        click.echo(f"{'start':>12}: {job_start(job)}{by.get(basis, '')}")
    status = job.get("status")
    if status:
        click.echo(f"{'status':>12}: {status['code']}")
        click.echo(f"{'waiting':>12}: {status['message']}")
        for reason, count in (status.get("node_reasons") or {}).items():
            click.echo(f"{'':>12}  {count} node(s): {reason}")
    _show_factors(job.get("priority_factors"))
    table(job.get("tasks", []), [("TASK", lambda t: f"{t['group']}-{t['index']}"),
                                 ("STATE", lambda t: t["state"]), ("NODE", lambda t: t["node"]),
                                 ("GPUS", lambda t: ",".join(map(str, t["devices"])) or None),
                                 ("EXIT", lambda t: t["exit_code"]),
                                 ("ATTEMPT", lambda t: t["attempt"]),
                                 ("CPU-EFF", lambda t: _percent(t, "cpu_percent")),
                                 ("MEM-EFF", lambda t: _percent(t, "memory_percent")),
                                 ("PEAK", _peak)], "no tasks")  # fmt: skip
    for task in job.get("tasks", []):
        if task.get("gpu_sharing"):  # how it holds its GPU, in the server's words
            isolation = task["gpu_sharing"]["isolation"]
            click.echo(f"{'gpu':>12}: {task['group']}-{task['index']} {isolation}")
    for task in job.get("tasks", []):
        if task.get("reason"):
            click.echo(f"{task['group']}-{task['index']}: {task['reason']}: {task['message']}")


FACTORS = ("age", "fair_share", "job_size", "queue", "job_priority")


def _show_factors(data: Any) -> None:
    """A waiting job's priority and what each factor adds (as `sprio` shows it)."""
    if not isinstance(data, dict):
        return
    factors, weighted = data.get("factors") or {}, data.get("weighted") or {}
    click.echo(f"{'sched prio':>12}: {data.get('priority')}")
    for name in FACTORS:
        if name in factors:
            click.echo(f"{name:>12}: {weighted.get(name, 0):>10}  (factor {factors[name]})")


def _percent(task: dict[str, Any], key: str) -> str | None:
    """An ended attempt's efficiency (as seff shows it), or None."""
    value = (task.get("usage") or {}).get(key)
    return None if value is None else f"{value:.1f}%"


def _peak(task: dict[str, Any]) -> str | None:
    usage = task.get("usage") or {}
    if usage.get("peak_memory") is None:
        return None
    return f"{memory_text(usage['peak_memory'])}/{memory_text(usage.get('memory', 0))}"


@cli.command()
@click.argument("job_ref", metavar="JOB_ID", type=JOB_ID)
@click.option("--follow", "-f", is_flag=True, help="keep printing until the job ends")
@click.option(
    "--task",
    "task_name",
    default=None,
    metavar="TASK",
    help="only this task: GROUP-INDEX as `berth show` lists it (or INDEX)",
)
@click.option("--attempt", type=int, default=None, help="an earlier attempt's output")
def logs(job_ref: JobRef, follow: bool, task_name: str | None, attempt: int | None) -> None:
    """A job's whole output, task by task (with -f: live, until the job ends). JOB_ID is an
    id or an array element (4_0)."""
    api = client()
    job_id = resolve(api, job_ref)
    tasks = _chosen_tasks(api.get(f"jobs/{job_id}/").get("tasks", []), task_name)
    if follow:
        _follow(api, job_id, [t["id"] for t in tasks] if task_name else None, attempt)
        return
    for task in tasks:
        prefix = f"[{task['group']}-{task['index']}] " if len(tasks) > 1 else ""
        chunks = api.stream(f"jobs/{job_id}/tasks/{task['id']}/log/", attempt=attempt)
        _echo_lines(chunks, prefix)


def _chosen_tasks(tasks: list[dict[str, Any]], name: str | None) -> list[dict[str, Any]]:
    """All of a job's tasks, or the one `name` picks (GROUP-INDEX, or INDEX)."""
    if name is None:
        return tasks
    chosen = [t for t in tasks if name in (f"{t['group']}-{t['index']}", str(t["index"]))]
    if len(chosen) != 1:
        names = ", ".join(f"{t['group']}-{t['index']}" for t in tasks) or "none"
        what = "is ambiguous" if chosen else "is not a task of this job"
        raise CliError(f"--task {name} {what} (its tasks: {names})")
    return chosen


def _echo_lines(chunks: Any, prefix: str) -> None:
    """Print streamed bytes as they come, `prefix` before each line."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    at_line_start = True
    for chunk in chunks:
        text = decoder.decode(chunk)
        if prefix and text:
            lines = text.splitlines(keepends=True)
            text = "".join((prefix if i or at_line_start else "") + line
                           for i, line in enumerate(lines))  # fmt: skip
            at_line_start = text.endswith("\n")
        click.echo(text, nl=False)
    click.echo(decoder.decode(b"", final=True), nl=False)
    sys.stdout.flush()


def _follow(api: Client, job_id: int, task_ids: list[int] | None, attempt: int | None) -> None:
    """Print new output as it comes (the JSON log pages), until the job ends."""
    offsets: dict[int, int] = {}
    several = False
    while True:
        ended = api.get(f"jobs/{job_id}/")["state"] in JOB_FINAL
        data = api.get(f"jobs/{job_id}/logs/", attempt=attempt)
        tasks = [t for t in data["tasks"] if task_ids is None or t["id"] in task_ids]
        several = several or len(tasks) > 1
        for task in tasks:
            _print_new(api, job_id, task, offsets, several, attempt)
        if ended:  # this read came after the job ended: nothing more will come
            return
        time.sleep(POLL_SECONDS)


def _print_new(api: Client, job_id: int, task: dict[str, Any], offsets: dict[int, int],
               several: bool, attempt: int | None) -> None:  # fmt: skip
    """Print what `task` wrote after what was printed already."""
    seen = offsets.get(task["id"])
    if seen is not None:
        task = api.get(f"jobs/{job_id}/logs/", task=task["id"], after=seen,
                       attempt=attempt)["tasks"][0]  # fmt: skip
    text = task["data"]
    offsets[task["id"]] = max(task.get("next_offset", 0), seen or 0)
    if not text:
        return
    if several:
        prefix = f"[{task['group']}-{task['index']}] "
        text = "".join(prefix + line for line in text.splitlines(keepends=True))
    click.echo(text, nl=False)
    sys.stdout.flush()


def _job_action(action: str, refs: tuple[JobRef, ...]) -> None:
    """Ask for `action` on each job in turn; one that fails (not found, refused) is reported
    and the others still asked; exit 1 if any failed."""
    api = client()
    failed = False
    for ref in refs:
        try:
            job = api.post(f"jobs/{resolve(api, ref)}/{action}/")
            click.echo(f"job {ref}: {action} requested ({job['state']})")
        except ApiError as exc:
            failed = True
            click.echo(f"berth: job {ref}: {'; '.join(exc.messages)}", err=True)
        except CliError as exc:
            failed = True
            click.echo(f"berth: {exc}", err=True)
    if failed:
        sys.exit(1)


@cli.command()
@click.argument("job_refs", metavar="JOB_ID...", type=JOB_ID, nargs=-1, required=True)
def cancel(job_refs: tuple[JobRef, ...]) -> None:
    """Cancel jobs: running tasks are stopped (SIGTERM, then SIGKILL)."""
    _job_action("cancel", job_refs)


@cli.command()
@click.argument("job_refs", metavar="JOB_ID...", type=JOB_ID, nargs=-1, required=True)
def suspend(job_refs: tuple[JobRef, ...]) -> None:
    """Suspend jobs: tasks stop and resources are freed until you resume them."""
    _job_action("suspend", job_refs)


@cli.command()
@click.argument("job_refs", metavar="JOB_ID...", type=JOB_ID, nargs=-1, required=True)
def resume(job_refs: tuple[JobRef, ...]) -> None:
    """Resume suspended jobs."""
    _job_action("resume", job_refs)


@cli.command()
@click.argument("job_ref", metavar="JOB_ID", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True)
def resubmit(job_ref: JobRef, as_json: bool) -> None:
    """Submit a fresh copy of a job (its spec as accepted); prints the new job's id."""
    api = client()
    created = api.post(f"jobs/{resolve(api, job_ref)}/resubmit/")
    if as_json:
        emit_json(created)
    else:
        click.echo(f"Submitted job {created['id']} (a copy of job {job_ref})")


def _remaining(ends_at: str) -> str:
    """`1h02m05s left (until <ends_at>)` for a running job's walltime end."""
    try:
        ends = datetime.fromisoformat(ends_at.replace("Z", "+00:00"))
    except ValueError:
        return ends_at
    seconds = max(0, int((ends - datetime.now(UTC)).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s left (until {ends_at})"


# --- interactive -----------------------------------------------------------------------

SHELL_HOLD = "exec sleep infinity"  # an interactive job's task: it holds the allocation


@cli.command(context_settings={"ignore_unknown_options": True})
@job_options
@click.option("--persist", is_flag=True,
              help="keep the job when the session ends idle or disconnected (berth attach"
                   " to it again; berth cancel ends it)")  # fmt: skip
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def shell(command: tuple[str, ...], persist: bool, **options: Any) -> None:
    """Get an allocation like `submit` does and open a terminal in it: a shell, or COMMAND
    after `--`. Exits with the remote command's exit status; the job ends with the session.

    \b
      berth shell --gpus 1 --time 2h
      berth shell --cpu 4 --mem 8Gi -- python -i
    """
    if options.get("array"):
        raise click.UsageError("--array: an interactive job is one task")
    spec = job_from_options(SHELL_HOLD, {**options, "name": options.get("name") or "shell"})
    spec["interactive"] = {"persist": persist}
    api = client()
    job_id = int(api.post("jobs/", spec)["id"])
    click.echo(f"Submitted interactive job {job_id}", err=True)
    try:
        _wait_until_running(api, job_id)
    except KeyboardInterrupt:
        api.post(f"jobs/{job_id}/cancel/")
        fail(f"cancelled job {job_id} before it started")
    sys.exit(attach_terminal(api.settings, job_id, _command_line(command)))


@cli.command()
@click.argument("job_ref", metavar="JOB_ID", type=JOB_ID)
@click.option("--by", "by", required=True, metavar="DURATION",
              help="how much longer: 30m, 1h30m, 01:30:00 or seconds")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print the job as JSON")
def extend(job_ref: JobRef, by: str, as_json: bool) -> None:
    """Give a running job of yours more time: up to its queue's max_walltime, and only when
    no waiting job's reservation would start later for it (the server names the job it
    would delay otherwise)."""
    api = client()
    job = api.post(f"jobs/{resolve(api, job_ref)}/extend/", {"by": by})
    if as_json:
        emit_json(job)
    else:
        click.echo(f"Job {job['id']}: walltime now {job['walltime']} s")


@cli.command()
@click.argument("job_ref", metavar="JOB_ID", type=JOB_ID)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def attach(job_ref: JobRef, command: tuple[str, ...]) -> None:
    """Open another terminal in a running job of yours: a shell, or COMMAND after `--`.
    Exits with the remote command's exit status."""
    api = client()
    sys.exit(attach_terminal(api.settings, resolve(api, job_ref), _command_line(command)))


def _command_line(command: tuple[str, ...]) -> str:
    return command[0] if len(command) == 1 else shlex.join(command)


def _wait_until_running(api: Client, job_id: int) -> None:
    """Poll while the job waits (often at first, then every POLL_SECONDS), saying its place
    and estimate when they change."""
    said = None
    began = time.monotonic()
    while True:
        job = api.get(f"jobs/{job_id}/")
        if job["state"] == "Running":
            return
        if job["state"] in JOB_FINAL:
            fail(f"job {job_id} is {job['state']}" + (f": {job.get('message')}"
                                                      if job.get("message") else ""))  # fmt: skip
        line = (f"job {job_id}: {job['state']}, position {job_position(job) or '-'},"
                f" start {job_start(job) or 'unknown'}")  # fmt: skip
        why = job_reason(job)
        line += f" ({why})" if why else ""
        if line != said:
            click.echo(line, err=True)
            said = line
        early = time.monotonic() - began < START_POLL_FOR
        time.sleep(START_POLL_SECONDS if early else POLL_SECONDS)


# --- flows ------------------------------------------------------------------------------


@cli.command("flows")
@click.option("--state", "-s", default=None)
@click.option("--limit", "-n", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def list_flows(state: str | None, limit: int, as_json: bool) -> None:
    """List flows, newest first."""
    rows = client().paged("flows/", limit=limit, state=state, ordering="-id")
    if as_json:
        emit_json(rows)
        return
    table(rows, [("ID", lambda f: f["id"]), ("NAME", lambda f: f["name"]),
                 ("USER", lambda f: f.get("owner")), ("STATE", lambda f: f["state"]),
                 ("STEPS", _steps_summary), ("MESSAGE", lambda f: f.get("message"))],
          "no flows")  # fmt: skip


def _steps_summary(flow: dict[str, Any]) -> str:
    steps = flow.get("steps", [])
    done = sum(1 for s in steps if s["state"] in ("Succeeded", "Skipped"))
    return f"{done}/{len(steps)}"


@cli.group()
def flow() -> None:
    """Submit, show, cancel, retry and resubmit flows."""


@flow.command("submit")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def flow_submit(file: Path, as_json: bool) -> None:
    """Submit a flow spec (YAML or JSON)."""
    created = client().post("flows/", load_spec_file(file))
    if as_json:
        emit_json(created)
    else:
        click.echo(f"Submitted flow {created['id']}")


@flow.command("show")
@click.argument("flow_id", type=FLOW_ID)
@click.option("--json", "as_json", is_flag=True)
def flow_show(flow_id: int, as_json: bool) -> None:
    """A flow's steps and the jobs each created."""
    data = client().get(f"flows/{flow_id}/")
    if as_json:
        emit_json(data)
        return
    click.echo(f"flow {data['id']} {data['name']}: {data['state']}"
               + (f" ({data['message']})" if data.get("message") else ""))  # fmt: skip
    table(data.get("steps", []), [("STEP", lambda s: s["name"]), ("STATE", lambda s: s["state"]),
                                  ("DEPENDS ON", lambda s: ",".join(s["depends_on"]) or None),
                                  ("JOBS", lambda s: ",".join(map(str, s["jobs"])) or None),
                                  ("MESSAGE", _step_message)], "no steps")  # fmt: skip


def _step_message(step: dict[str, Any]) -> str | None:
    """The step's message, or why it waits."""
    if step.get("message"):
        return str(step["message"])
    return f"waits: {step['waiting']}" if step.get("waiting") else None


@flow.command("cancel")
@click.argument("flow_id", type=FLOW_ID)
def flow_cancel(flow_id: int) -> None:
    """Cancel a flow and every job it runs."""
    data = client().post(f"flows/{flow_id}/cancel/")
    click.echo(f"flow {flow_id}: cancel requested ({data['state']})")


@flow.command("retry")
@click.argument("flow_id", type=FLOW_ID)
def flow_retry(flow_id: int) -> None:
    """Run a Failed flow's failed and skipped steps again; succeeded steps keep their jobs."""
    data = client().post(f"flows/{flow_id}/retry/")
    again = [s["name"] for s in data.get("steps", []) if s["state"] != "Succeeded"]
    click.echo(f"flow {flow_id}: retrying {', '.join(again)} ({data['state']})")


@flow.command("resubmit")
@click.argument("flow_id", type=FLOW_ID)
@click.option("--json", "as_json", is_flag=True)
def flow_resubmit(flow_id: int, as_json: bool) -> None:
    """Submit a fresh copy of a flow from its spec; every step runs again."""
    created = client().post(f"flows/{flow_id}/resubmit/")
    if as_json:
        emit_json(created)
    else:
        click.echo(f"Submitted flow {created['id']} (a copy of flow {flow_id})")


# --- cluster ----------------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def nodes(as_json: bool) -> None:
    """The cluster's nodes: state, cpu, memory, GPUs free/total and what each enforces on
    its tasks (a node that cannot enforce what it must says why it runs nothing)."""
    rows = client().paged("nodes/")
    if as_json:
        emit_json(rows)
        return
    table(rows, [("NAME", lambda n: n["name"]), ("STATE", _node_state),
                 ("CPU", lambda n: n.get("cpu")),
                 ("MEMORY", lambda n: memory_text(n.get("memory"))), ("GPUS", _gpus),
                 ("ENFORCES", _enforces), ("LABELS", _labels)], "no nodes")  # fmt: skip
    for node in rows:
        problem = (node.get("enforcement") or {}).get("problem")
        if problem:
            click.echo(f"{node['name']}: {problem}")


def _enforces(node: dict[str, Any]) -> str:
    """`cgroup v1: cpu,devices,memory,...`, or `-` for an agent that enforces nothing."""
    info = node.get("enforcement") or {}
    if not info.get("enforced"):
        return "-"
    return f"{info.get('cgroup') or '?'}:{','.join(info['enforced'])}"


def _node_state(node: dict[str, Any]) -> str:
    """Its state, and why it takes no new task when its agent says so (a full disk)."""
    pressure = (node.get("usage") or {}).get("pressure")
    return f"{node['state']} (no new tasks: {pressure})" if pressure else str(node["state"])


def _gpus(node: dict[str, Any]) -> str:
    devices = node.get("devices", [])
    free = sum(1 for d in devices if d.get("job") is None and d.get("healthy", True))
    return f"{free}/{len(devices)} free"


def _labels(node: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((node.get("labels") or {}).items()))


@cli.command()
@click.option("--since", default=None, help="from this day (YYYY-MM-DD)")
@click.option("--until", default=None, help="until this day (YYYY-MM-DD)")
@click.option("--group-by", type=click.Choice(["user", "queue", "day"]), default="user",
              show_default=True)  # fmt: skip
@click.option("--shares", is_flag=True, help="decayed usage, shares, factor (as sshare)")
@click.option("--json", "as_json", is_flag=True)
def usage(since: str | None, until: str | None, group_by: str, shares: bool,
          as_json: bool) -> None:  # fmt: skip
    """Accounting: jobs, cpu-hours and GPU-hours (yours, or everyone's for staff)."""
    if shares:
        _usage_shares(as_json)
        return
    data = client().get("usage/", since=since, until=until, group_by=group_by)
    rows = data.get("results", data) if isinstance(data, dict) else data
    if as_json:
        emit_json(rows)
        return
    table(rows, [(group_by.upper(), lambda r: r.get(group_by)), ("JOBS", lambda r: r.get("jobs")),
                 ("CPU-HOURS", lambda r: _hours(r.get("cpu_seconds"))),
                 ("GPU-HOURS", lambda r: _hours(r.get("gpu_seconds"))),
                 ("WALL-HOURS", lambda r: _hours(r.get("wall_seconds")))], "no usage")  # fmt: skip


def _usage_shares(as_json: bool) -> None:
    data = client().get("usage/shares/")
    if as_json:
        emit_json(data)
        return
    if data.get("factors_off"):
        click.echo("priority factors are off: jobs go by their own priority, then age")
    table(data.get("results", []), [("USER", lambda r: r["user"]),
                                    ("SHARES", lambda r: f"{r['shares']:g}"),
                                    ("NORM-SHARES", lambda r: f"{r['norm_shares']:.4f}"),
                                    ("USAGE", lambda r: f"{r['usage']:.0f}"),
                                    ("NORM-USAGE", lambda r: f"{r['norm_usage']:.4f}"),
                                    ("FAIRSHARE", lambda r: f"{r['fair_share']:.4f}")],
          "no users")  # fmt: skip


def _hours(seconds: Any) -> str:
    return f"{float(seconds or 0) / 3600:.2f}"


def main() -> None:
    cli(prog_name="berth")


if __name__ == "__main__":
    main()
