"""A manager's numbers (issue 31): model usage and run durations per UTC day, kept by triggers in the
same transaction as the kernel's writes (like 0002, 0004 and 0006), so a date range on the Agents
page or a scorecard reads summary rows.

- insights_usagedaily: the runs' `provider_call` trace events per agent, version, workspace, route
  and day of the call (the same calls and tokens as insights_usagetotal);
- insights_durationdaily (and insights_durationweekly, per ISO week): runs that finished per agent, version, workspace, day of the finish and
  duration bin (floor(ln(ms) / ln(1.1))), with their exact seconds summed. A run counts each time
  its `finished_at` is set (a run repaired and finished again counts again, as it ran again).
Existing calls and finished runs are folded in.
"""

from django.db import migrations, models


# As 0006: a call's `calls` when it reports a number, else one; token counts bounded before the cast.
CALLS = "CASE WHEN jsonb_typeof(n.data->'calls') = 'number' THEN LEAST(GREATEST(0, (n.data->>'calls')::numeric), 1e6)::bigint ELSE 1 END"
TOKENS = (
    "CASE WHEN jsonb_typeof(n.data->'usage'->'{key}') = 'number' "
    "THEN LEAST(GREATEST(0, (n.data->'usage'->>'{key}')::numeric), 1e9)::bigint ELSE 0 END"
)
SATURATED = 9000000000000000000
# A duration's bin: 10 % wide, from 1 ms; the seconds are bounded (a year) so no clock skew fails a write.
SECONDS = "LEAST(GREATEST(0, extract(epoch FROM n.finished_at - n.created_at)), 31536000)"
BIN = f"floor(ln(GREATEST(1, {SECONDS} * 1000)) / ln(1.1))::smallint"

USAGE_SELECT = f"""
  SELECT r.agent_name, COALESCE(av.version, 0), r.workspace_id, left(COALESCE(n.data->>'route', ''), 200),
         (n.at AT TIME ZONE 'UTC')::date,
         sum({CALLS}), sum({TOKENS.format(key="input_tokens")}), sum({TOKENS.format(key="output_tokens")})
  FROM {{source}} n
  JOIN runs_run r ON r.id = n.run_id
  LEFT JOIN runs_agentversion av ON av.id = r.agent_version_id
  WHERE n.event = 'provider_call' AND r.agent_name <> ''
  GROUP BY 1, 2, 3, 4, 5"""

DURATION_SELECT = f"""
  SELECT n.agent_name, COALESCE(av.version, 0), n.workspace_id, (n.finished_at AT TIME ZONE 'UTC')::date, {BIN},
         count(*), sum({SECONDS})
  FROM {{source}}
  LEFT JOIN runs_agentversion av ON av.id = n.agent_version_id
  WHERE n.agent_name <> '' AND n.finished_at IS NOT NULL{{extra}}
  GROUP BY 1, 2, 3, 4, 5"""

USAGE_UPSERT = """
  ON CONFLICT (agent_name, agent_version, workspace_id, route, day)
  DO UPDATE SET calls = LEAST(insights_usagedaily.calls::numeric + EXCLUDED.calls, {sat})::bigint,
                input_tokens = LEAST(insights_usagedaily.input_tokens::numeric + EXCLUDED.input_tokens, {sat})::bigint,
                output_tokens = LEAST(insights_usagedaily.output_tokens::numeric + EXCLUDED.output_tokens, {sat})::bigint""".format(
    sat=SATURATED
)
DURATION_UPSERT = """
  ON CONFLICT (agent_name, agent_version, workspace_id, day, bin)
  DO UPDATE SET runs = insights_durationdaily.runs + EXCLUDED.runs,
                seconds = insights_durationdaily.seconds + EXCLUDED.seconds"""
USAGE_INSERT = "INSERT INTO insights_usagedaily (agent_name, agent_version, workspace_id, route, day, calls, input_tokens, output_tokens)"
DURATION_INSERT = "INSERT INTO insights_durationdaily (agent_name, agent_version, workspace_id, day, bin, runs, seconds)"
# The week's Monday by date arithmetic (2000-01-03 was a Monday), as insights.numbers reads it.
WEEK = "(n.finished_at AT TIME ZONE 'UTC')::date - ((((n.finished_at AT TIME ZONE 'UTC')::date - DATE '2000-01-03') % 7 + 7) % 7)"
WEEKLY_INSERT = "INSERT INTO insights_durationweekly (agent_name, agent_version, workspace_id, week, bin, runs, seconds)"
WEEKLY_SELECT = DURATION_SELECT.replace("(n.finished_at AT TIME ZONE 'UTC')::date,", WEEK + ",", 1)
WEEKLY_UPSERT = """
  ON CONFLICT (agent_name, agent_version, workspace_id, week, bin)
  DO UPDATE SET runs = insights_durationweekly.runs + EXCLUDED.runs,
                seconds = insights_durationweekly.seconds + EXCLUDED.seconds"""

FINISHED = "new_rows n JOIN old_rows o ON o.id = n.id"
FINISHED_NOW = " AND n.finished_at IS DISTINCT FROM o.finished_at"

FORWARD = f"""
CREATE OR REPLACE FUNCTION insights_count_usage_daily() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  {USAGE_INSERT}{USAGE_SELECT.format(source="new_rows")}{USAGE_UPSERT};
  RETURN NULL;
END $$;

CREATE TRIGGER insights_count_usage_daily AFTER INSERT ON runs_traceevent
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION insights_count_usage_daily();

CREATE OR REPLACE FUNCTION insights_count_finished_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  {DURATION_INSERT}{DURATION_SELECT.format(source=FINISHED, extra=FINISHED_NOW)}{DURATION_UPSERT};
  {WEEKLY_INSERT}{WEEKLY_SELECT.format(source=FINISHED, extra=FINISHED_NOW)}{WEEKLY_UPSERT};
  RETURN NULL;
END $$;

CREATE TRIGGER insights_count_finished_runs AFTER UPDATE ON runs_run
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION insights_count_finished_runs();

CREATE OR REPLACE FUNCTION insights_count_runs_born_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  {DURATION_INSERT}{DURATION_SELECT.format(source="new_rows n", extra="")}{DURATION_UPSERT};
  {WEEKLY_INSERT}{WEEKLY_SELECT.format(source="new_rows n", extra="")}{WEEKLY_UPSERT};
  RETURN NULL;
END $$;

CREATE TRIGGER insights_count_runs_born_finished AFTER INSERT ON runs_run
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION insights_count_runs_born_finished();
"""

BACKFILL = f"""
{USAGE_INSERT}{USAGE_SELECT.format(source="runs_traceevent")};
{DURATION_INSERT}{DURATION_SELECT.format(source="runs_run n", extra="")};
{WEEKLY_INSERT}{WEEKLY_SELECT.format(source="runs_run n", extra="")};
"""

BACKWARD = """
DROP TRIGGER IF EXISTS insights_count_runs_born_finished ON runs_run;
DROP TRIGGER IF EXISTS insights_count_finished_runs ON runs_run;
DROP TRIGGER IF EXISTS insights_count_usage_daily ON runs_traceevent;
DROP FUNCTION IF EXISTS insights_count_runs_born_finished();
DROP FUNCTION IF EXISTS insights_count_finished_runs();
DROP FUNCTION IF EXISTS insights_count_usage_daily();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('insights', '0008_failure_group_triggers'),
        ('runs', '0018_run_records_its_code_digest'),
    ]

    operations = [
        migrations.CreateModel(
            name='DurationDaily',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('agent_name', models.CharField(max_length=100)),
                ('agent_version', models.PositiveIntegerField(default=0)),
                ('workspace_id', models.BigIntegerField()),
                ('day', models.DateField()),
                ('bin', models.SmallIntegerField()),
                ('runs', models.PositiveBigIntegerField(default=0)),
                ('seconds', models.FloatField(default=0)),
            ],
            options={
                'indexes': [models.Index(fields=['agent_name', 'day'], include=('agent_version', 'workspace_id', 'bin', 'runs', 'seconds'), name='duration_daily_cover')],
                'constraints': [models.UniqueConstraint(fields=('agent_name', 'agent_version', 'workspace_id', 'day', 'bin'), name='duration_daily_key')],
            },
        ),
        migrations.CreateModel(
            name='DurationWeekly',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('agent_name', models.CharField(max_length=100)),
                ('agent_version', models.PositiveIntegerField(default=0)),
                ('workspace_id', models.BigIntegerField()),
                ('week', models.DateField()),
                ('bin', models.SmallIntegerField()),
                ('runs', models.PositiveBigIntegerField(default=0)),
                ('seconds', models.FloatField(default=0)),
            ],
            options={
                'indexes': [models.Index(fields=['agent_name', 'week'], include=('agent_version', 'workspace_id', 'bin', 'runs', 'seconds'), name='duration_weekly_cover')],
                'constraints': [models.UniqueConstraint(fields=('agent_name', 'agent_version', 'workspace_id', 'week', 'bin'), name='duration_weekly_key')],
            },
        ),
        migrations.CreateModel(
            name='UsageDaily',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('agent_name', models.CharField(max_length=100)),
                ('agent_version', models.PositiveIntegerField(default=0)),
                ('workspace_id', models.BigIntegerField()),
                ('route', models.CharField(max_length=200)),
                ('day', models.DateField()),
                ('calls', models.PositiveBigIntegerField(default=0)),
                ('input_tokens', models.PositiveBigIntegerField(default=0)),
                ('output_tokens', models.PositiveBigIntegerField(default=0)),
            ],
            options={
                'indexes': [models.Index(fields=['agent_name', 'day'], include=('agent_version', 'workspace_id', 'route', 'calls', 'input_tokens', 'output_tokens'), name='usage_daily_cover')],
                'constraints': [models.UniqueConstraint(fields=('agent_name', 'agent_version', 'workspace_id', 'route', 'day'), name='usage_daily_key')],
            },
        ),
        migrations.RunSQL(FORWARD + BACKFILL, BACKWARD),
    ]
