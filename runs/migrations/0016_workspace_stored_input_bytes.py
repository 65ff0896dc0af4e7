"""A workspace keeps the bytes of its people's runs' stored inputs (the `input_bytes` quota)."""

from django.db import migrations, models

# The runs already stored count from the start (child runs' inputs, which delegation writes, do not).
BACKFILL = """
UPDATE runs_workspace AS w
SET stored_input_bytes = COALESCE((
    SELECT SUM(octet_length(r.input::text)) FROM runs_run AS r
    WHERE r.workspace_id = w.id AND r.parent_id IS NULL AND r.input IS NOT NULL AND r.input <> 'null'::jsonb
), 0)
"""


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0015_test_tool_ledgers_move_to_testtools"),
    ]

    operations = [
        migrations.AddField(
            model_name="workspace",
            name="stored_input_bytes",
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
