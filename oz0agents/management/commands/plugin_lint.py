"""`./oz0 plugin lint PATH...`: check agent manifests as F2-F8 say, in the `path:line: level: message` form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from oz0agents.lint import lint

MANIFEST_SUFFIXES = (".yaml", ".yml")


class Command(BaseCommand):
    help = "Lint agent manifests (files, or folders of *.yaml). Exit 1 when any has an error."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+", help="manifest files, or folders holding them")

    def handle(self, *args: Any, **options: Any) -> None:
        files: list[Path] = []
        for raw in options["paths"]:
            path = Path(raw)
            if path.is_dir():
                files.extend(sorted(p for p in path.iterdir() if p.suffix in MANIFEST_SUFFIXES))
            elif path.exists():
                files.append(path)
            else:
                raise CommandError(f"{raw}: no such file or folder")
        errors = warnings = 0
        for path in files:
            linted = lint(path.read_text(encoding="utf-8", errors="replace"))
            for problem in linted.errors:
                self.stdout.write(f"{path}:{problem.line}: error: {problem}")
            for problem in linted.warnings:
                self.stdout.write(f"{path}:{problem.line}: warning: {problem}")
            errors += len(linted.errors)
            warnings += len(linted.warnings)
        self.stderr.write(f"{len(files)} manifest(s): {errors} error(s), {warnings} warning(s)")
        if errors:
            raise SystemExit(1)
