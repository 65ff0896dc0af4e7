"""Agent and AgentVersion join this app's state; their tables (`runs_agent`, `runs_agentversion`)
stay as they are, so this migration changes no database (runs.0007 drops them from runs' state)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("runs", "0006_effects_belong_to_a_workspace"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Agent",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("name", models.CharField(max_length=100)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "workspace",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="agents", to="runs.workspace"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_agent",
                        "constraints": [
                            models.UniqueConstraint(fields=("workspace", "name"), name="agent_unique_name_per_workspace")
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="AgentVersion",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("version", models.PositiveIntegerField()),
                        ("manifest_text", models.TextField()),
                        ("manifest", models.JSONField()),
                        ("digest", models.CharField(max_length=64)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "agent",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="versions", to="agents.agent"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_agentversion",
                        "ordering": ["agent", "-version"],
                        "constraints": [models.UniqueConstraint(fields=("agent", "version"), name="agent_version_unique")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
