"""Delegation (F14-F16): a child run knows its parent run, the delegate task that started it and
its depth in the tree; the delegate task knows its child run."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_task_approved_digest"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="children",
                to="runs.run",
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="parent_task_key",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.AddField(
            model_name="run",
            name="depth",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="task",
            name="child",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="runs.run",
            ),
        ),
    ]
