"""manage.py run_notifier: deliver job notifications (email, webhooks) from the outbox, with
retries; several may run at once (rows are claimed with SKIP LOCKED)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from scheduler.management.stopping import stop_on_signals
from scheduler.notifications.delivery import run_loop, run_once


class Command(BaseCommand):
    help = (
        "Deliver job notifications (docs/notifications.md) at least once: email through"
        " Django's mail backend, signed webhooks to allowed hosts; retries with capped"
        " backoff; stops cleanly on SIGTERM."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=None,
                            help="seconds between idle passes (BERTH_NOTIFY_INTERVAL)")  # fmt: skip
        parser.add_argument("--once", action="store_true", help="one pass, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["once"]:
            self.stdout.write(f"{run_once()} notifications tried")
            return
        run_loop(stop_on_signals(), options["interval"])
