"""manage.py run_simagent: many fake nodes in one process, for demos and benchmarks."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler.agent.runtime import parse_labels
from scheduler.agent.sim import SimCluster
from scheduler.core.quantity import parse_cpu, parse_memory
from scheduler.management.commands.run_agent import join_token_from
from scheduler.management.stopping import stop_on_signals


class Command(BaseCommand):
    help = (
        "Run N fake nodes in one process over the agent protocol. A task 'runs' for"
        " BERTH_SIM_DURATION seconds from its env (default: half its walltime, or 1 s) and"
        " exits with BERTH_SIM_EXIT (default 0)."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        return super().create_parser(prog_name, subcommand, allow_abbrev=False, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--server", required=True)
        parser.add_argument(
            "--join-token-file",
            default=None,
            metavar="PATH",
            help="read the cluster's join token from PATH (default: $BERTH_JOIN_TOKEN)",
        )
        parser.add_argument("--nodes", type=int, required=True, help="how many fake nodes")
        parser.add_argument("--gpus", type=int, default=0, help="GPUs per node")
        parser.add_argument("--cpu", default="8", help="cpu per node, e.g. 64 or 500m")
        parser.add_argument("--memory", default="64Gi", help="memory per node, e.g. 512Gi")
        parser.add_argument("--prefix", default="sim", help="node names: PREFIX-0000, ...")
        parser.add_argument("--labels", default="", help="labels of every node, k=v,k=v")
        parser.add_argument("--workers", type=int, default=8, help="concurrent HTTP requests")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["nodes"] < 1:
            raise CommandError("--nodes: must be at least 1")
        if options["gpus"] < 0 or options["workers"] < 1:
            raise CommandError("--gpus must be 0 or more and --workers at least 1")
        try:
            cpu = parse_cpu(options["cpu"])
            memory = parse_memory(options["memory"])
            labels = parse_labels(options["labels"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        join_token = join_token_from(options["join_token_file"])
        cluster = SimCluster(
            options["server"], join_token, options["nodes"], options["gpus"], cpu,
            memory, prefix=options["prefix"], labels=labels, workers=options["workers"],
        )  # fmt: skip
        stop = stop_on_signals()
        cluster.run(stop)
