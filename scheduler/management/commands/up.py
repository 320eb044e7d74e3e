"""manage.py up: the whole cluster in one process, on embedded defaults.

The web server (daphne), the scheduler loop and a local agent run together. The scheduler loop
runs on a worker thread started from daphne's own event loop (sync_to_async), so when it
publishes a change, async_to_sync sends it on that same loop: the in-memory channel layer,
which only works inside one event loop, still carries every push to the browsers.
"""

from __future__ import annotations

import asyncio
import logging
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

log = logging.getLogger("berth.up")


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
        parser.add_argument("--agent-name", default="", help="node name (default: hostname)")
        parser.add_argument("--labels", default="", help="local node labels, k=v,k=v")

    def handle(self, *args: Any, **options: Any) -> None:
        port = options["port"]
        if not 0 < port < 65536:
            raise CommandError(f"--port: {port} is not a TCP port (1-65535)")
        if options["fake_gpus"] < 0:
            raise CommandError("--fake-gpus: must be 0 or more")
        host = options["host"]
        self._check_port_free(host, port)

        call_command("migrate", interactive=False, verbosity=0)
        login = self._ensure_admin()
        data = Path(settings.DATA_DIR)
        if not settings.BERTH_JOIN_TOKEN:
            settings.BERTH_JOIN_TOKEN = _kept_secret(data / "join_token")
        url = f"http://{host}:{port}"

        self.stdout.write(self.style.SUCCESS(f"Berth is starting on {url}"))
        self.stdout.write(f"  admin login:  {login}")
        self.stdout.write(f"  API docs:     {url}/api/docs/   admin: {url}/admin/")
        self.stdout.write(f"  database:     {settings.DATABASES['default']['NAME']}")
        if not options["no_agent"]:
            self.stdout.write(
                f"  local agent:  joins with the token in {data / 'join_token'}"
                if (data / "join_token").exists()
                else "  local agent:  joins with BERTH_JOIN_TOKEN"
            )
        self.stdout.write("Press Ctrl-C to stop.")

        from daphne.server import Server  # installs the asyncio reactor; import late
        from twisted.internet import reactor

        from berth.asgi import application

        stop = threading.Event()

        def ready() -> None:
            loop = asyncio.get_event_loop()
            if not options["no_scheduler"]:
                loop.create_task(self._scheduler(stop))
            if not options["no_agent"]:
                threading.Thread(
                    target=self._agent,
                    args=(f"http://127.0.0.1:{port}", options, stop),
                    name="berth-local-agent",
                    daemon=True,
                ).start()

        reactor.addSystemEventTrigger("before", "shutdown", stop.set)  # type: ignore[attr-defined,arg-type]
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
        users = get_user_model()
        path = Path(settings.DATA_DIR) / "admin_password"
        if not users.objects.filter(is_superuser=True).exists():
            password = _kept_secret(path)
            users.objects.create_superuser("admin", password=password)
            return f"admin / {password}  (kept in {path})"
        if path.exists():
            return f"admin / {path.read_text().strip()}  (kept in {path})"
        return "your existing superuser (manage.py changepassword to reset)"

    async def _scheduler(self, stop: threading.Event) -> None:
        from scheduler.leader import leader_lock
        from scheduler.management.commands.run_scheduler import run_loop

        def run() -> None:
            lock = leader_lock()
            try:
                run_loop(lock, settings.BERTH_SCHEDULER_INTERVAL, stop, log_idle=False)
            finally:
                lock.release()

        await sync_to_async(run, thread_sensitive=False)()

    def _agent(self, server: str, options: dict[str, Any], stop: threading.Event) -> None:
        from scheduler.agent.runtime import Agent

        agent = Agent(
            server=server,
            join_token=settings.BERTH_JOIN_TOKEN,
            name=options["agent_name"] or None,
            labels=options["labels"],
            fake_gpus=options["fake_gpus"],
            work_dir=Path(settings.DATA_DIR) / "agent",
        )
        try:
            agent.run(stop)
        except Exception:
            log.exception("the local agent stopped")
