"""The rollup triggers keep the all-time totals too (F18): one more grouped upsert per statement.

A scorecard over an agent's whole history then reads the totals (a few hundred rows)
instead of a year of daily rows. Existing daily rows are folded into the totals.
"""

import importlib
import re

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
  INSERT INTO insights_failuretotal (agent_name, agent_version, workspace_id, kind, failed)
  SELECT n.agent_name, COALESCE(n.agent_version, 0), n.workspace_id, n.kind, count(*)
  FROM new_rows n
  GROUP BY 1, 2, 3, 4
  ON CONFLICT (agent_name, agent_version, workspace_id, kind)
  DO UPDATE SET failed = insights_failuretotal.failed + EXCLUDED.failed;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION insights_count_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO insights_rundaily (agent_name, agent_version, workspace_id, day, started)
  SELECT n.agent_name, COALESCE(av.version, 0), n.workspace_id, (n.created_at AT TIME ZONE 'UTC')::date, count(*)
  FROM new_rows n LEFT JOIN runs_agentversion av ON av.id = n.agent_version_id
  WHERE n.agent_name <> ''
  GROUP BY 1, 2, 3, 4
  ON CONFLICT (agent_name, agent_version, workspace_id, day)
  DO UPDATE SET started = insights_rundaily.started + EXCLUDED.started;
  INSERT INTO insights_runtotal (agent_name, agent_version, workspace_id, started)
  SELECT n.agent_name, COALESCE(av.version, 0), n.workspace_id, count(*)
  FROM new_rows n LEFT JOIN runs_agentversion av ON av.id = n.agent_version_id
  WHERE n.agent_name <> ''
  GROUP BY 1, 2, 3
  ON CONFLICT (agent_name, agent_version, workspace_id)
  DO UPDATE SET started = insights_runtotal.started + EXCLUDED.started;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION insights_count_repairs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  WITH repaired AS (
    SELECT r.agent_name, COALESCE(av.version, 0) AS agent_version, r.workspace_id, n.data->>'resolution' AS resolution,
           (n.at AT TIME ZONE 'UTC')::date AS day,
           count(*) AS repairs,
           count(r.held_since) AS held,
           COALESCE(sum(GREATEST(0, extract(epoch FROM n.at - r.held_since))), 0) AS held_seconds,
           COALESCE(max(GREATEST(0, extract(epoch FROM n.at - r.held_since))), 0) AS held_seconds_max
    FROM new_rows n
    JOIN runs_run r ON r.id = n.run_id
    LEFT JOIN runs_agentversion av ON av.id = r.agent_version_id
    WHERE n.event = 'resolved' AND n.data->>'resolution' IN ('retried', 'abandoned') AND r.agent_name <> ''
    GROUP BY 1, 2, 3, 4, 5
  ), daily AS (
    INSERT INTO insights_repairdaily (agent_name, agent_version, workspace_id, resolution, day, repairs, held, held_seconds, held_seconds_max)
    SELECT * FROM repaired
    ON CONFLICT (agent_name, agent_version, workspace_id, resolution, day)
    DO UPDATE SET repairs = insights_repairdaily.repairs + EXCLUDED.repairs,
                  held = insights_repairdaily.held + EXCLUDED.held,
                  held_seconds = insights_repairdaily.held_seconds + EXCLUDED.held_seconds,
                  held_seconds_max = GREATEST(insights_repairdaily.held_seconds_max, EXCLUDED.held_seconds_max)
  )
  INSERT INTO insights_repairtotal (agent_name, agent_version, workspace_id, resolution, repairs, held, held_seconds, held_seconds_max)
  SELECT agent_name, agent_version, workspace_id, resolution, sum(repairs), sum(held), sum(held_seconds), max(held_seconds_max)
  FROM repaired GROUP BY 1, 2, 3, 4
  ON CONFLICT (agent_name, agent_version, workspace_id, resolution)
  DO UPDATE SET repairs = insights_repairtotal.repairs + EXCLUDED.repairs,
                held = insights_repairtotal.held + EXCLUDED.held,
                held_seconds = insights_repairtotal.held_seconds + EXCLUDED.held_seconds,
                held_seconds_max = GREATEST(insights_repairtotal.held_seconds_max, EXCLUDED.held_seconds_max);
  RETURN NULL;
END $$;

"""

# The totals of what the daily rollups already counted.
BACKFILL = r"""
INSERT INTO insights_failuretotal (agent_name, agent_version, workspace_id, kind, failed)
SELECT agent_name, agent_version, workspace_id, kind, sum(failed) FROM insights_failuredaily GROUP BY 1, 2, 3, 4;
INSERT INTO insights_runtotal (agent_name, agent_version, workspace_id, started)
SELECT agent_name, agent_version, workspace_id, sum(started) FROM insights_rundaily GROUP BY 1, 2, 3;
INSERT INTO insights_repairtotal (agent_name, agent_version, workspace_id, resolution, repairs, held, held_seconds, held_seconds_max)
SELECT agent_name, agent_version, workspace_id, resolution, sum(repairs), sum(held), sum(held_seconds), max(held_seconds_max)
FROM insights_repairdaily GROUP BY 1, 2, 3, 4;
"""


def _previous_functions() -> str:
    """0002's function definitions, to restore them when this migration is reversed."""
    previous = importlib.import_module("insights.migrations.0002_rollup_triggers").FORWARD
    return "\n".join(re.findall(r"CREATE OR REPLACE FUNCTION .*?END \$\$;", previous, flags=re.S))


BACKWARD = _previous_functions() + "\nDELETE FROM insights_repairtotal; DELETE FROM insights_runtotal; DELETE FROM insights_failuretotal;"


class Migration(migrations.Migration):
    dependencies = [("insights", "0003_all_time_totals")]

    operations = [migrations.RunSQL(FORWARD + BACKFILL, BACKWARD)]
