"""Triggers that keep the scorecard rollups current (F18).

Statement-level triggers with transition tables: one grouped upsert per INSERT
statement, so the kernel's bulk trace inserts and a benchmark's million-row load
cost one aggregate each, not one upsert per row. Days are UTC days.

Repairs read `runs_run.held_since` at the moment the `resolved` event is
inserted: the kernel inserts a transaction's trace events before it saves the
run row, so the hold's start is still there when a retry or abandon releases it.
"""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION insights_count_findings() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO insights_failuredaily (agent_name, agent_version, workspace_id, kind, day, failed)
  SELECT n.agent_name, COALESCE(n.agent_version, 0), n.workspace_id, n.kind, (n.created_at AT TIME ZONE 'UTC')::date, count(*)
  FROM new_rows n
  GROUP BY 1, 2, 3, 4, 5
  ON CONFLICT (agent_name, agent_version, workspace_id, kind, day)
  DO UPDATE SET failed = insights_failuredaily.failed + EXCLUDED.failed;
  RETURN NULL;
END $$;

CREATE TRIGGER insights_count_findings AFTER INSERT ON runs_finding
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION insights_count_findings();

CREATE OR REPLACE FUNCTION insights_count_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO insights_rundaily (agent_name, agent_version, workspace_id, day, started)
  SELECT n.agent_name, COALESCE(av.version, 0), n.workspace_id, (n.created_at AT TIME ZONE 'UTC')::date, count(*)
  FROM new_rows n LEFT JOIN runs_agentversion av ON av.id = n.agent_version_id
  WHERE n.agent_name <> ''
  GROUP BY 1, 2, 3, 4
  ON CONFLICT (agent_name, agent_version, workspace_id, day)
  DO UPDATE SET started = insights_rundaily.started + EXCLUDED.started;
  RETURN NULL;
END $$;

CREATE TRIGGER insights_count_runs AFTER INSERT ON runs_run
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION insights_count_runs();

CREATE OR REPLACE FUNCTION insights_count_repairs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO insights_repairdaily (agent_name, agent_version, workspace_id, resolution, day, repairs, held, held_seconds, held_seconds_max)
  SELECT r.agent_name, COALESCE(av.version, 0), r.workspace_id, n.data->>'resolution', (n.at AT TIME ZONE 'UTC')::date,
         count(*),
         count(r.held_since),
         COALESCE(sum(GREATEST(0, extract(epoch FROM n.at - r.held_since))), 0),
         COALESCE(max(GREATEST(0, extract(epoch FROM n.at - r.held_since))), 0)
  FROM new_rows n
  JOIN runs_run r ON r.id = n.run_id
  LEFT JOIN runs_agentversion av ON av.id = r.agent_version_id
  WHERE n.event = 'resolved' AND n.data->>'resolution' IN ('retried', 'abandoned') AND r.agent_name <> ''
  GROUP BY 1, 2, 3, 4, 5
  ON CONFLICT (agent_name, agent_version, workspace_id, resolution, day)
  DO UPDATE SET repairs = insights_repairdaily.repairs + EXCLUDED.repairs,
                held = insights_repairdaily.held + EXCLUDED.held,
                held_seconds = insights_repairdaily.held_seconds + EXCLUDED.held_seconds,
                held_seconds_max = GREATEST(insights_repairdaily.held_seconds_max, EXCLUDED.held_seconds_max);
  RETURN NULL;
END $$;

CREATE TRIGGER insights_count_repairs AFTER INSERT ON runs_traceevent
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION insights_count_repairs();
"""

# What existed before the triggers (holds of the past are unknown: held = 0).
BACKFILL = r"""
INSERT INTO insights_failuredaily (agent_name, agent_version, workspace_id, kind, day, failed)
SELECT agent_name, COALESCE(agent_version, 0), workspace_id, kind, (created_at AT TIME ZONE 'UTC')::date, count(*)
FROM runs_finding GROUP BY 1, 2, 3, 4, 5;

INSERT INTO insights_rundaily (agent_name, agent_version, workspace_id, day, started)
SELECT r.agent_name, COALESCE(av.version, 0), r.workspace_id, (r.created_at AT TIME ZONE 'UTC')::date, count(*)
FROM runs_run r LEFT JOIN runs_agentversion av ON av.id = r.agent_version_id
WHERE r.agent_name <> '' GROUP BY 1, 2, 3, 4;

INSERT INTO insights_repairdaily (agent_name, agent_version, workspace_id, resolution, day, repairs, held, held_seconds, held_seconds_max)
SELECT r.agent_name, COALESCE(av.version, 0), r.workspace_id, t.data->>'resolution', (t.at AT TIME ZONE 'UTC')::date, count(*), 0, 0, 0
FROM runs_traceevent t JOIN runs_run r ON r.id = t.run_id LEFT JOIN runs_agentversion av ON av.id = r.agent_version_id
WHERE t.event = 'resolved' AND t.data->>'resolution' IN ('retried', 'abandoned') AND r.agent_name <> ''
GROUP BY 1, 2, 3, 4, 5;
"""

BACKWARD = r"""
DROP TRIGGER IF EXISTS insights_count_repairs ON runs_traceevent;
DROP TRIGGER IF EXISTS insights_count_runs ON runs_run;
DROP TRIGGER IF EXISTS insights_count_findings ON runs_finding;
DROP FUNCTION IF EXISTS insights_count_repairs();
DROP FUNCTION IF EXISTS insights_count_runs();
DROP FUNCTION IF EXISTS insights_count_findings();
DELETE FROM insights_repairdaily;
DELETE FROM insights_rundaily;
DELETE FROM insights_failuredaily;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("insights", "0001_rollup_tables"),
        ("runs", "0001_initial_run_store"),
    ]

    operations = [migrations.RunSQL(FORWARD + BACKFILL, BACKWARD)]
