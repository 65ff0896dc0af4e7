"""`./oz0 job search QUERY`: failed runs' findings (F18), e.g. `"finding:failure_not_found agent:triage"`."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from insights import search
from runs.kernel import KernelError
from tenancy.models import Workspace

COLUMNS = ("created_at", "workspace", "agent", "version", "kind", "flags", "step", "error_key", "attempts", "run")


def flags_of(item: dict[str, Any]) -> str:
    return ",".join(flag for flag in ("retryable", "partial", "person", "declared") if item[flag]) or "-"


def table(rows: list[list[str]], columns: tuple[str, ...]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


class Command(BaseCommand):
    help = "Search findings: finding:failure_<kind> agent:NAME version:N since:DATE until:DATE step:KEY step_kind:KIND"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("query", nargs="*", help="terms, e.g. finding:failure_not_found agent:triage")
        parser.add_argument("--workspace", help="only this workspace's findings (default: every workspace)")
        parser.add_argument("--limit", type=int, default=50)
        parser.add_argument("--cursor", help="continue from the `next` cursor of an earlier page")
        parser.add_argument("--json", action="store_true", help="print the page as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        workspaces = dict(Workspace.objects.values_list("pk", "slug"))
        if options["workspace"] and options["workspace"] not in workspaces.values():
            raise CommandError(f"no such workspace: {options['workspace']}")
        try:
            page = search.search_page(
                " ".join(options["query"]),
                workspaces,
                cursor=options["cursor"],
                limit=options["limit"],
                workspace=options["workspace"],
                reader=search.SERVER,
            )
        except KernelError as error:
            raise CommandError(f"{error.key}: {error.detail}") from None
        if options["json"]:
            self.stdout.write(json.dumps(page, indent=2))
            return
        rows = [
            [
                item["created_at"][:19],
                item["workspace"] or "-",
                item["agent"] or "-",
                str(item["version"] or "-"),
                item["kind"],
                flags_of(item),
                f"{item['step']['key']} ({item['step']['kind']})" if item["step"] else "-",
                item["error_key"] or "-",
                str(item["attempts"]),
                item["run"],
            ]
            for item in page["items"]
        ]
        self.stdout.write(table(rows, COLUMNS))
        self.stdout.write(f"{len(rows)} finding(s)" + (f"; more with --cursor {page['next']}" if page["next"] else ""))
