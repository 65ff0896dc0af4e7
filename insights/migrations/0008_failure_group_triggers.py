"""The trigger that counts failure groups as findings are written, and the count of those before it.

Statement-level with a transition table, like the rollups' (0002): one grouped upsert per
INSERT, so a bulk load costs one aggregate. A finding with no fingerprint (a loader that
predates the column) belongs to no group. Kind, agent and error key are part of the
fingerprint, so they are the same for every finding of a group.
"""

from django.db import migrations

UPSERT = r"""
  INSERT INTO insights_failuregroup (workspace_id, fingerprint, agent_name, kind, error_key, failed, first_seen, last_seen,
                                     first_version, last_version)
  SELECT n.workspace_id, n.fingerprint, min(n.agent_name), min(n.kind), min(n.error_key), count(*),
         min(n.created_at), max(n.created_at), min(COALESCE(n.agent_version, 0)), max(COALESCE(n.agent_version, 0))
  FROM {source} n
  WHERE n.fingerprint <> ''
  GROUP BY 1, 2
  ON CONFLICT (workspace_id, fingerprint)
  DO UPDATE SET failed = insights_failuregroup.failed + EXCLUDED.failed,
                first_seen = LEAST(insights_failuregroup.first_seen, EXCLUDED.first_seen),
                last_seen = GREATEST(insights_failuregroup.last_seen, EXCLUDED.last_seen),
                first_version = LEAST(insights_failuregroup.first_version, EXCLUDED.first_version),
                last_version = GREATEST(insights_failuregroup.last_version, EXCLUDED.last_version);
  INSERT INTO insights_failuregroupversion (workspace_id, fingerprint, agent_name, agent_version, failed, first_seen, last_seen)
  SELECT n.workspace_id, n.fingerprint, min(n.agent_name), COALESCE(n.agent_version, 0), count(*), min(n.created_at),
         max(n.created_at)
  FROM {source} n
  WHERE n.fingerprint <> ''
  GROUP BY 1, 2, 4
  ON CONFLICT (workspace_id, fingerprint, agent_version)
  DO UPDATE SET failed = insights_failuregroupversion.failed + EXCLUDED.failed,
                first_seen = LEAST(insights_failuregroupversion.first_seen, EXCLUDED.first_seen),
                last_seen = GREATEST(insights_failuregroupversion.last_seen, EXCLUDED.last_seen);
"""

FORWARD = (
    "CREATE OR REPLACE FUNCTION insights_count_failure_groups() RETURNS trigger LANGUAGE plpgsql AS $$\nBEGIN\n"
    + UPSERT.format(source="new_rows")
    + "  RETURN NULL;\nEND $$;\n"
    + "CREATE TRIGGER insights_count_failure_groups AFTER INSERT ON runs_finding "
    + "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION insights_count_failure_groups();\n"
)

BACKFILL = UPSERT.format(source="runs_finding")

BACKWARD = r"""
DROP TRIGGER IF EXISTS insights_count_failure_groups ON runs_finding;
DROP FUNCTION IF EXISTS insights_count_failure_groups();
DELETE FROM insights_failuregroupversion;
DELETE FROM insights_failuregroup;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("insights", "0007_failure_group_tables"),
        ("runs", "0020_finding_fingerprint_backfill"),
    ]

    operations = [migrations.RunSQL(FORWARD + BACKFILL, BACKWARD)]
