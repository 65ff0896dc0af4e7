"""`./oz0 eval run AGENT --version N [--workspace WS] [--wait] [--timeout S] [--as USER] [--json]`:
run an agent's regression cases against one of its versions and print, per case, the kind
before and after and whether it passed (evals.running says what passing means).

Acts for the platform (like the demo loader) unless `--as` names a member with write standing.
Exit status: 0 when no case failed again, 1 when one did (or on an error), 2 when --wait ran out
of time with cases still going; without --wait the runs are started and the command returns.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from evals import running
from evals.models import Eval
from insights.management.commands.job_search import table
from oz0agents.models import Agent
from runs.kernel import KernelError
from tenancy.models import Workspace

VERDICT_WORDS = {
    "passed": "passed",
    "passed_other_failure": "passed (failed another way)",
    "failed_again": "FAILED (same kind)",
    "none": "-",
}


class Command(BaseCommand):
    help = "Run an agent's regression cases against a version; print each case's kind before and after"

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # `--version N` is the agent's version here, not Django's own --version.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent")
        parser.add_argument("--version", dest="agent_version", type=int, required=True, help="the version to run the cases on")
        parser.add_argument("--workspace", help="the agent's workspace (needed when several have an agent of that name)")
        parser.add_argument("--wait", action="store_true", help="wait for every case's run to end")
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits at most (600)")
        parser.add_argument("--as", dest="as_user", help="start the runs as this member (default: the platform)")
        parser.add_argument("--json", action="store_true", help="print the eval as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.workspace(options["agent"], options["workspace"])
        user = None
        if options["as_user"]:
            user = get_user_model().objects.filter(username=options["as_user"]).first()
            if user is None:
                raise CommandError(f"no such user: {options['as_user']}")
        try:
            evaluation = running.start(
                workspace=workspace, user=user, body={"agent": options["agent"], "version": options["agent_version"]}
            )
        except KernelError as error:
            raise CommandError(f"{error.key}: {error.detail}") from None
        if options["wait"]:
            evaluation = running.wait(evaluation, timeout=max(0.0, options["timeout"]))
        doc = running.document(evaluation)
        if options["json"]:
            self.stdout.write(json.dumps(doc, indent=2))
        else:
            self.write_eval(workspace, evaluation, doc, waited=options["wait"])
        if doc["counts"]["failed"]:
            raise SystemExit(1)
        if options["wait"] and doc["counts"]["pending"]:
            raise SystemExit(2)

    def workspace(self, agent: str, slug: str | None) -> Workspace:
        if slug:
            workspace = Workspace.objects.filter(slug=slug).first()
            if workspace is None:
                raise CommandError(f"no such workspace: {slug}")
            return workspace
        found = list(Agent.objects.filter(name=agent).select_related("workspace")[:2])
        if not found:
            raise CommandError(f"no agent named {agent!r} in any workspace")
        if len(found) > 1:
            raise CommandError(f"several workspaces have an agent named {agent!r}: name one with --workspace")
        return found[0].workspace

    def write_eval(self, workspace: Workspace, evaluation: Eval, doc: dict[str, Any], *, waited: bool) -> None:
        c = doc["counts"]
        self.stdout.write(
            f"eval {doc['id']}: {doc['agent']} v{doc['version']} in {workspace.slug}, {c['cases']} case(s), by {doc['started_by']}"
        )
        rows = [
            [
                str(r["case"]),
                r["kind_before"],
                r["kind_after"] or ("completed" if r["outcome"] == "completed" else "-"),
                r["outcome"] + (f" ({r['reason']})" if r["reason"] else ""),
                VERDICT_WORDS.get(r["verdict"], r["verdict"]) if r["outcome"] != "pending" else "pending",
                "replayed" if r["replayed"] else "live",
                (r["run"] or "-")[:8],
            ]
            for r in doc["results"]
        ]
        self.stdout.write(table(rows, ("case", "kind before", "kind after", "outcome", "passed", "answers", "run")))
        self.stdout.write(
            f"{c['passed']} passed, {c['failed']} failed, {c['pending']} pending, {c['no_verdict']} without a verdict"
        )
        if c["pending"] and not waited:
            self.stdout.write(
                f"the runs are going: GET /api/v1/workspaces/{workspace.slug}/evals/{evaluation.pk}, "
                f"or the console's /w/{workspace.slug}/regression-cases/"
            )
