"""manage.py run_agent: this machine's agent, a thin alias of `python -m scheduler.agent`
(scheduler/agent/command.py), which runs on a node without Django."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler.agent import command


def join_token_from(path: str | None) -> str:
    """The join token (scheduler.agent.command.join_token_from), or CommandError."""
    try:
        return command.join_token_from(path)
    except command.UsageError as exc:
        raise CommandError(str(exc)) from None


class Command(BaseCommand):
    help = command.DESCRIPTION

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # No abbreviations: the removed --join-token must not silently mean --join-token-file.
        return super().create_parser(prog_name, subcommand, allow_abbrev=False, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        command.add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            command.run(options)
        except command.UsageError as exc:
            raise CommandError(str(exc)) from None
