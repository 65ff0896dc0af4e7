"""Task.approved_digest: an approval is bound to the digest of the call it approved. A call approved
before this field existed (state.approved) is bound to its arguments as they stand now."""

import hashlib
import json

from django.db import migrations, models


def bind_existing_approvals(apps, schema_editor):  # type: ignore[no-untyped-def]
    Task = apps.get_model("runs", "Task")
    for task in Task.objects.filter(state__approved=True).only("pk", "spec").iterator():
        # The digest runs.kernel.approvals.call_digest computes, frozen here as migrations freeze code.
        canonical = json.dumps(
            {"args": {} if task.spec.get("args") is None else task.spec["args"], "tool": task.spec.get("tool")},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
        Task.objects.filter(pk=task.pk).update(approved_digest=digest)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0008_trace_audit_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="approved_digest",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.RunPython(bind_existing_approvals, migrations.RunPython.noop),
    ]
