"""manage.py run_agent: this machine's agent."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler.agent.runtime import Agent, parse_labels
from scheduler.management.stopping import stop_on_signals

log = logging.getLogger("berth.agent")


class Command(BaseCommand):
    help = (
        "Run the node agent: register this machine with the server (cpu, memory, GPUs found"
        " through NVML, or --fake-gpus), then heartbeat, run the tasks the server assigns as"
        " real processes and ship their output. It talks to the server over HTTP only."
        " SIGTERM stops the agent; its tasks go on unless --kill-on-exit, and a restarted"
        " agent re-adopts them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--server", required=True, help="the server's URL")
        parser.add_argument("--join-token", required=True, help="the cluster's join token")
        parser.add_argument("--name", default=None, help="node name (default: the hostname)")
        parser.add_argument("--labels", default="", help="node labels, k=v,k=v")
        parser.add_argument(
            "--fake-gpus", type=int, default=0, help="N fake GPUs if NVML finds none"
        )
        parser.add_argument("--work-dir", default="berth-agent", help="where tasks run")
        parser.add_argument("--state-file", default=None, help="default: WORK_DIR/state.json")
        parser.add_argument("--kill-on-exit", action="store_true", help="kill tasks on exit")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["server"].startswith(("http://", "https://")):
            raise CommandError(f"--server: expected an http(s):// URL, got {options['server']!r}")
        if options["fake_gpus"] < 0:
            raise CommandError("--fake-gpus: must be 0 or more")
        try:
            parse_labels(options["labels"])
        except ValueError as exc:
            raise CommandError(f"--labels: {exc}") from None
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        agent = Agent(
            server=options["server"],
            join_token=options["join_token"],
            name=options["name"],
            labels=options["labels"],
            fake_gpus=options["fake_gpus"],
            work_dir=Path(options["work_dir"]),
            state_file=options["state_file"],
            kill_on_exit=options["kill_on_exit"],
        )
        stop = stop_on_signals()
        agent.run(stop)
