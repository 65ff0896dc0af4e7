"""Await resolution tokens are stored as their SHA-256, like API and executor tokens: a read of
the database no longer hands out the bearer proofs of pending awaits."""

import hashlib

from django.db import migrations


def hash_tokens(apps, schema_editor):
    Task = apps.get_model("runs", "Task")
    for task_id, token in Task.objects.filter(resolution_token__isnull=False).values_list("pk", "resolution_token").iterator():
        Task.objects.filter(pk=task_id).update(resolution_token=hashlib.sha256(token.encode()).hexdigest())


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0004_api_tokens_expire_and_revoke"),
    ]

    operations = [
        migrations.RunPython(hash_tokens, migrations.RunPython.noop),
    ]
