"""Workspace, Membership and ApiToken now belong to the `tenancy` app: runs' state lets go of them
and every foreign key to a workspace points at `tenancy.Workspace` (the other apps' keys moved in
agents.0002 and notify.0002). The tables keep their names, so no SQL runs."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0016_workspace_stored_input_bytes"),
        ("tenancy", "0001_initial"),
        ("agents", "0002_i28_tenancy_workspace"),
        ("notify", "0002_i28_tenancy_workspace"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="run",
                    name="workspace",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="runs", to="tenancy.workspace"
                    ),
                ),
                migrations.AlterField(
                    model_name="idempotencykey",
                    name="workspace",
                    field=models.ForeignKey(
                        db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="+", to="tenancy.workspace"
                    ),
                ),
                migrations.AlterField(
                    model_name="executor",
                    name="workspace",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="executors",
                        to="tenancy.workspace",
                    ),
                ),
                migrations.DeleteModel(name="ApiToken"),
                migrations.DeleteModel(name="Membership"),
                migrations.DeleteModel(name="Workspace"),
            ],
            database_operations=[],
        ),
    ]
