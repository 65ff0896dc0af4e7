"""Code versions and model usage on the scorecard (issue 29): two all-time totals and the
triggers that keep them in the same transaction as the kernel's writes (like 0002 and 0004).

- insights_coderuntotal: runs started per agent, version, workspace and code digest (a run's
  `code_digest` when it was created);
- insights_usagetotal: the runs' `provider_call` trace events (a model call of oz0's loop or of a
  framework in a harnessed round), their calls and tokens, per the same keys and the call's route.
Existing runs and provider calls are folded in.
"""

from django.db import migrations, models

# A call's events count the requests they cover (`calls`, a framework's report of several), else
# one; a token count is what the call's `usage` says when it is a number of at least 0, else 0. Both
# are bounded before the cast (a billion tokens a call at most), so no number a harness reports can fail the kernel's transaction.
CALLS = "CASE WHEN jsonb_typeof(n.data->'calls') = 'number' THEN LEAST(GREATEST(0, (n.data->>'calls')::numeric), 1e6)::bigint ELSE 1 END"
TOKENS = (
    "CASE WHEN jsonb_typeof(n.data->'usage'->'{key}') = 'number' "
    "THEN LEAST(GREATEST(0, (n.data->'usage'->>'{key}')::numeric), 1e9)::bigint ELSE 0 END"
)

# The totals stop at this rather than overflow (an overflow would fail the kernel's transaction).
SATURATED = 9000000000000000000

FORWARD = rf"""
CREATE OR REPLACE FUNCTION insights_count_code_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO insights_coderuntotal (agent_name, agent_version, workspace_id, code_digest, started, first_started_at)
  SELECT n.agent_name, COALESCE(av.version, 0), n.workspace_id, n.code_digest, count(*), min(n.created_at)
  FROM new_rows n LEFT JOIN runs_agentversion av ON av.id = n.agent_version_id
  WHERE n.agent_name <> ''
  GROUP BY 1, 2, 3, 4
  ON CONFLICT (agent_name, agent_version, workspace_id, code_digest)
  DO UPDATE SET started = insights_coderuntotal.started + EXCLUDED.started,
                first_started_at = LEAST(insights_coderuntotal.first_started_at, EXCLUDED.first_started_at);
  RETURN NULL;
END $$;

CREATE TRIGGER insights_count_code_runs AFTER INSERT ON runs_run
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION insights_count_code_runs();

CREATE OR REPLACE FUNCTION insights_count_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO insights_usagetotal (agent_name, agent_version, workspace_id, code_digest, route, calls, input_tokens, output_tokens)
  SELECT r.agent_name, COALESCE(av.version, 0), r.workspace_id, r.code_digest, left(COALESCE(n.data->>'route', ''), 200),
         sum({CALLS}), sum({TOKENS.format(key="input_tokens")}), sum({TOKENS.format(key="output_tokens")})
  FROM new_rows n
  JOIN runs_run r ON r.id = n.run_id
  LEFT JOIN runs_agentversion av ON av.id = r.agent_version_id
  WHERE n.event = 'provider_call' AND r.agent_name <> ''
  GROUP BY 1, 2, 3, 4, 5
  ON CONFLICT (agent_name, agent_version, workspace_id, code_digest, route)
  DO UPDATE SET calls = LEAST(insights_usagetotal.calls::numeric + EXCLUDED.calls, {SATURATED})::bigint,
                input_tokens = LEAST(insights_usagetotal.input_tokens::numeric + EXCLUDED.input_tokens, {SATURATED})::bigint,
                output_tokens = LEAST(insights_usagetotal.output_tokens::numeric + EXCLUDED.output_tokens, {SATURATED})::bigint;
  RETURN NULL;
END $$;

CREATE TRIGGER insights_count_usage AFTER INSERT ON runs_traceevent
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION insights_count_usage();
"""

BACKFILL = rf"""
INSERT INTO insights_coderuntotal (agent_name, agent_version, workspace_id, code_digest, started, first_started_at)
SELECT n.agent_name, COALESCE(av.version, 0), n.workspace_id, n.code_digest, count(*), min(n.created_at)
FROM runs_run n LEFT JOIN runs_agentversion av ON av.id = n.agent_version_id
WHERE n.agent_name <> '' GROUP BY 1, 2, 3, 4;

INSERT INTO insights_usagetotal (agent_name, agent_version, workspace_id, code_digest, route, calls, input_tokens, output_tokens)
SELECT r.agent_name, COALESCE(av.version, 0), r.workspace_id, r.code_digest, left(COALESCE(n.data->>'route', ''), 200),
       sum({CALLS}), sum({TOKENS.format(key="input_tokens")}), sum({TOKENS.format(key="output_tokens")})
FROM runs_traceevent n JOIN runs_run r ON r.id = n.run_id LEFT JOIN runs_agentversion av ON av.id = r.agent_version_id
WHERE n.event = 'provider_call' AND r.agent_name <> ''
GROUP BY 1, 2, 3, 4, 5;
"""

BACKWARD = r"""
DROP TRIGGER IF EXISTS insights_count_usage ON runs_traceevent;
DROP TRIGGER IF EXISTS insights_count_code_runs ON runs_run;
DROP FUNCTION IF EXISTS insights_count_usage();
DROP FUNCTION IF EXISTS insights_count_code_runs();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("insights", "0005_covering_indexes"),
        ("runs", "0018_run_records_its_code_digest"),
    ]

    operations = [
        migrations.CreateModel(
            name="CodeRunTotal",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("agent_name", models.CharField(max_length=100)),
                ("agent_version", models.PositiveIntegerField(default=0)),
                ("workspace_id", models.BigIntegerField()),
                ("code_digest", models.CharField(max_length=64)),
                ("started", models.PositiveBigIntegerField(default=0)),
                ("first_started_at", models.DateTimeField()),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("agent_name", "agent_version", "workspace_id", "code_digest"), name="code_run_total_key"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="UsageTotal",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("agent_name", models.CharField(max_length=100)),
                ("agent_version", models.PositiveIntegerField(default=0)),
                ("workspace_id", models.BigIntegerField()),
                ("code_digest", models.CharField(max_length=64)),
                ("route", models.CharField(max_length=200)),
                ("calls", models.PositiveBigIntegerField(default=0)),
                ("input_tokens", models.PositiveBigIntegerField(default=0)),
                ("output_tokens", models.PositiveBigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("agent_name", "agent_version", "workspace_id", "code_digest", "route"), name="usage_total_key"
                    )
                ],
            },
        ),
        migrations.RunSQL(FORWARD + BACKFILL, BACKWARD),
    ]
