"""`./oz0 manage prune [--batch-size N]`: one retention pass now (beat runs one every OZ0_PRUNE_SECONDS).

Deletes finished runs' trace events (their audit rows with them) and findings older than each
workspace's retention, in batches of at most N rows (default OZ0_PRUNE_BATCH); see runs/retention.py.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs import retention


class Command(BaseCommand):
    help = "Prune trace events and findings older than each workspace's retention, in bounded batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None, help="rows per batch (default OZ0_PRUNE_BATCH)")

    def handle(self, *args: Any, **options: Any) -> None:
        batch = options["batch_size"]
        if batch is not None and batch <= 0:
            raise CommandError("--batch-size must be a positive number of rows")
        pruned = retention.prune(batch=batch)
        self.stdout.write(
            f"pruned {pruned.trace} trace events and {pruned.findings} findings "
            f"in {pruned.batches} batches ({pruned.seconds:.2f}s)"
        )
