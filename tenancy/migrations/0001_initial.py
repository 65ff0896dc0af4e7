"""Workspace, Membership and ApiToken join this app's state; their tables (`runs_workspace`,
`runs_membership`, `runs_apitoken`) stay as they are, so this migration changes no database
(runs.0017 drops them from runs' state once every foreign key points here)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("runs", "0016_workspace_stored_input_bytes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Workspace",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("slug", models.SlugField(max_length=64, unique=True)),
                        ("name", models.CharField(blank=True, max_length=200)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("stored_input_bytes", models.BigIntegerField(default=0)),
                    ],
                    options={"db_table": "runs_workspace"},
                ),
                migrations.CreateModel(
                    name="ApiToken",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("digest", models.CharField(max_length=64, unique=True)),
                        ("hint", models.CharField(blank=True, default="", max_length=8)),
                        ("label", models.CharField(blank=True, max_length=100)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("last_used_at", models.DateTimeField(blank=True, null=True)),
                        ("expires_at", models.DateTimeField(blank=True, null=True)),
                        ("revoked_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="api_tokens",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={"db_table": "runs_apitoken"},
                ),
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        (
                            "role",
                            models.CharField(
                                choices=[("viewer", "Viewer"), ("reader", "Reader"), ("operator", "Operator")], max_length=16
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "workspace",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to="tenancy.workspace"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_membership",
                        "constraints": [models.UniqueConstraint(fields=("workspace", "user"), name="membership_unique_user")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
