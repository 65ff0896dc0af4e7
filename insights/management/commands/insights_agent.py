"""`./oz0 insights agent NAME [--version V] [--since DATE]`: an agent's scorecard as tables (F18)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from insights import search, selectors
from insights.management.commands.job_search import table
from runs.kernel import KernelError
from tenancy.models import Workspace


def pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


class Command(BaseCommand):
    help = "An agent's scorecard: failed runs by kind, in all and per version, rates, trend per day, repairs"

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # `--version V` is the agent's version here, not Django's own --version.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent")
        parser.add_argument("--version", dest="agent_version", type=int, help="only this version")
        parser.add_argument("--since", help="from this day (YYYY-MM-DD) or ISO datetime")
        parser.add_argument("--until", help="up to this day (YYYY-MM-DD) or ISO datetime")
        parser.add_argument("--workspace", help="only this workspace (default: every workspace)")
        parser.add_argument("--json", action="store_true", help="print the scorecard as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace_ids = None
        if options["workspace"]:
            workspace_ids = list(Workspace.objects.filter(slug=options["workspace"]).values_list("pk", flat=True))
            if not workspace_ids:
                raise CommandError(f"no such workspace: {options['workspace']}")
        try:
            since = search.parse_moment("since", options["since"], end_of_day=False) if options["since"] else None
            until = search.parse_moment("until", options["until"], end_of_day=True) if options["until"] else None
            card = selectors.scorecard(options["agent"], options["agent_version"], since, until, workspace_ids=workspace_ids)
        except KernelError as error:
            raise CommandError(f"{error.key}: {error.detail}") from None
        if options["json"]:
            self.stdout.write(json.dumps(card, indent=2))
            return
        self.write_card(card)

    def write_card(self, card: dict[str, Any]) -> None:
        window = f" since {card['since']}" if card["since"] else ""
        window += f" until {card['until']}" if card["until"] else ""
        self.stdout.write(f"agent {card['agent']}{window}: {card['runs']} run(s), {card['failed']} failed ({pct(card['rate'])})")
        self.stdout.write("")
        self.stdout.write("failed runs by kind")
        kinds = [
            [
                k["kind"],
                str(k["failed"]),
                pct(k["rate"]),
                ",".join(f for f in ("retryable", "partial", "person") if k.get(f)) or "-",
                "yes" if k["declared"] else "no",
            ]
            for k in card["by_kind"]
        ]
        self.stdout.write(table(kinds, ("kind", "failed", "rate", "flags", "declared")))
        self.stdout.write("")
        self.stdout.write("per version")
        versions = []
        for v in card["versions"]:
            top = ", ".join(f"{k['kind']} {k['failed']}" for k in v["by_kind"][:3]) or "-"
            r = v["repairs"]
            versions.append(
                [
                    str(v["version"] or "-"),
                    str(v["runs"]),
                    str(v["failed"]),
                    pct(v["rate"]),
                    str(r["retried"]),
                    str(r["abandoned"]),
                    top,
                ]
            )
        self.stdout.write(table(versions, ("version", "runs", "failed", "rate", "retried", "abandoned", "top kinds")))
        self.stdout.write("")
        r = card["repairs"]
        mean = "-" if r["hold_to_repair_mean_seconds"] is None else f"{r['hold_to_repair_mean_seconds']:.1f}s"
        longest = "-" if r["hold_to_repair_max_seconds"] is None else f"{r['hold_to_repair_max_seconds']:.1f}s"
        self.stdout.write(
            f"repairs: {r['retried']} retried, {r['abandoned']} abandoned; hold to repair: mean {mean}, max {longest} over {r['after_hold']}"
        )
        self.stdout.write("")
        self.stdout.write("trend per day")
        trend = [[d["day"], str(d["runs"]), str(d["failed"]), pct(d["rate"])] for d in card["trend"] if d["runs"] or d["failed"]]
        self.stdout.write(table(trend, ("day", "runs", "failed", "rate")) if trend else "(no runs in the window)")
