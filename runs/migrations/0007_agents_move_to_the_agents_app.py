"""Agent and AgentVersion now belong to the `agents` app: runs' state lets go of them and
Run.agent_version points at `agents.AgentVersion`. The tables keep their names, so no SQL runs."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0006_effects_belong_to_a_workspace"),
        ("agents", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="run",
                    name="agent_version",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="runs",
                        to="agents.agentversion",
                    ),
                ),
                migrations.DeleteModel(name="AgentVersion"),
                migrations.DeleteModel(name="Agent"),
            ],
            database_operations=[],
        ),
    ]
