"""manage.py up: the whole cluster in one process, on embedded defaults.

The web server (daphne), the scheduler loop, the notifier (`run_notifier`'s loop) and a local
agent run together. The scheduler loop
runs on a worker thread started from daphne's own event loop (sync_to_async), and when it
publishes a change scheduler/notify.py sends it on daphne's loop (`run_on_layer_loop`): the
in-memory channel layer, which only works inside one event loop, still carries every push to
the browsers. Both run supervised (scheduler/management/stopping.py): a scheduler loop or an
agent that fails is logged and started again, never left dead while the web server runs.

The local agent follows the same rules as `run_agent`: as root its tasks run as an unprivileged
account, with an environment built from scratch, in work dirs outside the data dir. The data
dir (secret key, admin password, join token, SQLite database, the agent's node token) is made
0700 with 0600 files, so no task can read it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler.agent.command import TASK_UIDS_TEXT
from scheduler.agent.gpumodes import parse_fake_mig
from scheduler.agent.isolation import DEFAULT_TASK_USER, parse_uid_range
from scheduler.agent.runtime import Agent
from scheduler.management.stopping import supervise

log = logging.getLogger("berth.up")
SECRET_FILES = ("secret_key", "admin_password", "join_token", "berth.sqlite3",
                "berth.sqlite3-journal", "berth.sqlite3-wal", "berth.sqlite3-shm")  # fmt: skip


def _lock_data_dir(data: Path) -> None:
    """Only the server's user may read the data dir: it holds every secret of the cluster."""
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    data.chmod(0o700)
    for name in SECRET_FILES:
        if (data / name).exists():
            (data / name).chmod(0o600)


def _task_uids() -> tuple[int, int] | None:
    """The local agent's uid range for users without an account (BERTH_TASK_UIDS)."""
    try:
        return parse_uid_range(os.environ.get("BERTH_TASK_UIDS", "").strip() or TASK_UIDS_TEXT)
    except ValueError as exc:
        raise CommandError(f"BERTH_TASK_UIDS: {exc}") from None


def default_task_dir(data: Path) -> Path:
    """Task work dirs live beside the data dir, never inside it (tasks must not reach it)."""
    return data.parent / f"{data.name}-tasks"


def _is_terminal(out: Any) -> bool:
    stream = getattr(out, "_out", out)  # Django's OutputWrapper keeps the stream it wraps
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _kept_secret(path: Path, make: Any = lambda: secrets.token_urlsafe(24)) -> str:
    """Read a secret kept in the data folder, making it on first run."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = str(make())
    path.write_text(value)
    path.chmod(0o600)
    return value


class Command(BaseCommand):
    help = (
        "Run Berth in one process: migrate, create an admin login on first run, then serve"
        " the web UI and API (daphne), run the scheduler loop and a local agent for this"
        " machine. Embedded defaults: SQLite in ./data, in-memory channel layer."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
        parser.add_argument("--port", type=int, default=8000, help="port to listen on")
        parser.add_argument("--no-agent", action="store_true", help="do not start a local agent")
        parser.add_argument(
            "--no-scheduler", action="store_true", help="do not run the scheduler loop here"
        )
        parser.add_argument(
            "--fake-gpus",
            type=int,
            default=0,
            help="give the local agent N fake GPU devices (when NVML finds none)",
        )
        parser.add_argument(
            "--fake-mig",
            action="append",
            default=[],
            metavar="GPU:PROFILES",
            help="give fake GPU GPU (an index below --fake-gpus) MIG instances of these"
            " profiles, e.g. 0:1g.10gb,1g.10gb,2g.20gb; repeat for more GPUs (no real MIG)",
        )
        parser.add_argument("--agent-name", default="", help="node name (default: hostname)")
        parser.add_argument("--labels", default="", help="local node labels, k=v,k=v")
        parser.add_argument(
            "--agent-work-dir",
            default=None,
            help="where the local agent makes task work dirs (default: DATA_DIR-tasks, beside"
            " the data dir)",
        )
        parser.add_argument(
            "--task-user",
            default=os.environ.get("BERTH_TASK_USER", "").strip() or DEFAULT_TASK_USER,
            help="as root with BERTH_TASK_UIDS=off: the one account for tasks whose owner has"
            " no Unix account here (default: $BERTH_TASK_USER or nobody; never root); else"
            " each such user gets a uid of its own from BERTH_TASK_UIDS",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = options["host"], options["port"]
        work = self._checked_options(options)
        data = Path(settings.DATA_DIR)
        login = self._prepare_data_dir(data)
        agent = None if options["no_agent"] else self._local_agent(port, work, options)
        self._print_welcome(f"http://{host}:{port}", login, data, agent)
        self._serve(host, port, agent, run_scheduler=not options["no_scheduler"])

    def _checked_options(self, options: dict[str, Any]) -> Path:
        """Refuse bad options before anything is written; returns the agent's work dir."""
        port = options["port"]
        if not 0 < port < 65536:
            raise CommandError(f"--port: {port} is not a TCP port (1-65535)")
        if options["fake_gpus"] < 0:
            raise CommandError("--fake-gpus: must be 0 or more")
        try:
            options["fake_mig"] = parse_fake_mig(options["fake_mig"], options["fake_gpus"])
        except ValueError as exc:
            raise CommandError(f"--fake-mig: {exc}") from None
        self._check_port_free(options["host"], port)
        data = Path(settings.DATA_DIR)
        work = Path(options["agent_work_dir"] or default_task_dir(data))
        if work.resolve().is_relative_to(data.resolve()):
            raise CommandError(
                f"--agent-work-dir: {work} is inside the data dir {data}, which holds the"
                " cluster's secrets: choose a directory outside it"
            )
        return work

    def _prepare_data_dir(self, data: Path) -> str:
        """Lock the data dir, migrate, keep the admin login and join token; returns the login
        line to print."""
        _lock_data_dir(data)
        call_command("migrate", interactive=False, verbosity=0)
        login = self._ensure_admin()
        if not settings.BERTH_JOIN_TOKEN:
            settings.BERTH_JOIN_TOKEN = _kept_secret(data / "join_token")
        _lock_data_dir(data)  # the database file may be new
        return login

    def _print_welcome(self, url: str, login: str, data: Path, agent: Agent | None) -> None:
        self.stdout.write(self.style.SUCCESS(f"Berth is starting on {url}"))
        self.stdout.write(f"  admin login:  {login}")
        self.stdout.write(f"  API docs:     {url}/api/docs/   admin: {url}/admin/")
        self.stdout.write(f"  database:     {settings.DATABASES['default']['NAME']}")
        if agent is not None:
            self.stdout.write(
                f"  local agent:  joins with the token in {data / 'join_token'}"
                if (data / "join_token").exists()
                else "  local agent:  joins with BERTH_JOIN_TOKEN"
            )
            self.stdout.write(f"  task dirs:    {agent.work_dir}")
        self.stdout.write("Press Ctrl-C to stop.")

    def _serve(self, host: str, port: int, agent: Agent | None, *, run_scheduler: bool) -> None:
        """Run daphne until Ctrl-C; once it listens, start the scheduler loop on its event loop
        and the local agent on a thread. Shutdown sets `stop` for both."""
        from daphne.server import Server  # installs the asyncio reactor; import late
        from twisted.internet import reactor
        from twisted.internet.threads import deferToThread

        from berth.asgi import application

        stop = threading.Event()
        agent_thread = threading.Thread(target=self._agent, args=(agent, stop),
                                        name="berth-local-agent", daemon=True)  # fmt: skip
        notifier_thread = threading.Thread(target=self._notifier, args=(stop,),
                                           name="berth-notifier", daemon=True)  # fmt: skip

        def ready() -> None:
            loop = asyncio.get_event_loop()
            if run_scheduler:
                loop.create_task(self._scheduler(stop))
            if agent is not None:
                agent_thread.start()
            notifier_thread.start()

        def stopping() -> Any:
            """Stop the loops; the server waits, still serving, while the local agent stops
            its tasks (SIGTERM, SIGKILL after the grace) and reports them: nothing a task
            started outlives `up`."""
            stop.set()
            if agent is None or not agent_thread.is_alive():
                return None
            # the in-flight step (HTTP timeout), the lease thread, then the kill and its grace
            return deferToThread(agent_thread.join, agent.grace + agent.timeout + 20)

        reactor.addSystemEventTrigger("before", "shutdown", stopping)  # type: ignore[attr-defined,arg-type]
        Server(
            application=application,
            endpoints=[f"tcp:port={port}:interface={host}"],
            ready_callable=ready,
            verbosity=0,
        ).run()

    def _check_port_free(self, host: str, port: int) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror}") from None

    def _ensure_admin(self) -> str:
        """The login line to print: the password itself only to a terminal. Sent to a file or
        a pipe (`nohup ./run up > up.log &`) it would sit in a file readable by others, tasks
        included; the line names the 0600 file that holds it instead."""
        users = get_user_model()
        path = Path(settings.DATA_DIR) / "admin_password"
        if not users.objects.filter(is_superuser=True).exists():
            password = _kept_secret(path)
            users.objects.create_superuser("admin", password=password)
        elif not path.exists():
            return "your existing superuser (manage.py changepassword to reset)"
        if _is_terminal(self.stdout):
            return f"admin / {path.read_text().strip()}  (kept in {path})"
        return f"admin / the password in {path} (mode 0600; not printed: output is not a terminal)"

    async def _scheduler(self, stop: threading.Event) -> None:
        from scheduler.cycle.leader import leader_lock
        from scheduler.management.commands.run_scheduler import run_loop

        def run(stop: threading.Event) -> None:
            lock = leader_lock()
            try:
                run_loop(lock, settings.BERTH_SCHEDULER_INTERVAL, stop, log_idle=False)
            finally:
                lock.release()

        await sync_to_async(supervise, thread_sensitive=False)("the scheduler loop", run, stop)

    def _local_agent(self, port: int, work: Path, options: dict[str, Any]) -> Agent:
        """The local agent, checked (task account, directories) before anything starts."""
        data = Path(settings.DATA_DIR)
        agent = Agent(
            server=f"http://127.0.0.1:{port}",
            join_token=settings.BERTH_JOIN_TOKEN,  # in memory: never on a command line
            name=options["agent_name"] or None,
            labels=options["labels"],
            fake_gpus=options["fake_gpus"],
            fake_mig=options["fake_mig"],
            work_dir=work,
            state_dir=data / "agent",
            task_user=options["task_user"],
            task_uids=_task_uids(),
            kill_on_exit=True,  # up's tasks stop with it (_serve waits for them)
        )
        try:
            agent.prepare()
        except (ValueError, OSError) as exc:
            raise CommandError(f"local agent: {exc}") from None
        return agent

    def _agent(self, agent: Agent, stop: threading.Event) -> None:
        supervise("the local agent", agent.run, stop)

    def _notifier(self, stop: threading.Event) -> None:
        """Job notifications (scheduler/notifications/delivery.py), as `run_notifier`
        delivers them."""
        from scheduler.notifications.delivery import run_loop

        supervise("the notifier", run_loop, stop)
