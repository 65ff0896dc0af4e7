"""Stamp the findings written before fingerprints with theirs, in bounded batches.

A finding's message is its run's (`runs_run.failure->>'message'`); a finding whose run is gone
groups by kind, agent and error key alone. Batches of BATCH findings by id, each one UPDATE,
so a million findings never hold one long statement or a million rows in memory.
"""

from typing import Any

from django.db import migrations

from runs.fingerprints import failure_fingerprint

BATCH = 5000


def stamp(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    last = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT f.id, f.kind, f.agent_name, f.error_key, r.failure->>'message' FROM runs_finding f "
                "LEFT JOIN runs_run r ON r.id = f.run_id WHERE f.id > %s AND f.fingerprint = '' ORDER BY f.id LIMIT %s",
                [last, BATCH],
            )
            rows = cursor.fetchall()
            if not rows:
                return
            stamps = [
                (pk, failure_fingerprint(kind=kind, agent=agent, error_key=error_key, message=message))
                for pk, kind, agent, error_key, message in rows
            ]
            cursor.execute(
                "UPDATE runs_finding f SET fingerprint = s.fingerprint "
                "FROM unnest(%s::bigint[], %s::text[]) AS s(id, fingerprint) WHERE f.id = s.id",
                [[pk for pk, _ in stamps], [fp for _, fp in stamps]],
            )
            last = rows[-1][0]


class Migration(migrations.Migration):
    # Each batch commits on its own: a restart picks up where it stopped (fingerprint = '').
    atomic = False
    dependencies = [("runs", "0019_finding_fingerprint_and_failure_search")]

    operations = [migrations.RunPython(stamp, migrations.RunPython.noop)]
