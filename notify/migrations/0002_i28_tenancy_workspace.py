"""Subscription.workspace points at `tenancy.Workspace` (the same table, runs_workspace): state only."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("notify", "0001_initial"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="subscription",
                    name="workspace",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="notify_subscriptions",
                        to="tenancy.workspace",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
