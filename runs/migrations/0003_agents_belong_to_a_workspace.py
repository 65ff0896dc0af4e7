"""Agents belong to a workspace.

An existing agent moves to the workspace its runs ran in; an agent whose runs ran in several
workspaces is copied into each (versions and all) and each workspace's runs point at their own
copy, so no run changes what it ran. An agent nobody ran goes to the demo workspace (or the
oldest one; a `demo` workspace is made when there is none).
"""

import django.db.models.deletion
from django.db import migrations, models


def assign_workspaces(apps, schema_editor):
    Agent = apps.get_model("runs", "Agent")
    AgentVersion = apps.get_model("runs", "AgentVersion")
    Run = apps.get_model("runs", "Run")
    Workspace = apps.get_model("runs", "Workspace")
    for agent in Agent.objects.filter(workspace__isnull=True).order_by("pk"):
        used = set(Run.objects.filter(agent_version__agent=agent).values_list("workspace_id", flat=True))
        if not used:
            home = Workspace.objects.filter(slug="demo").first() or Workspace.objects.order_by("pk").first()
            if home is None:
                home = Workspace.objects.create(slug="demo", name="Demo")
            used = {home.pk}
        demo = Workspace.objects.filter(slug="demo", pk__in=used).values_list("pk", flat=True).first()
        ordered = sorted(used, key=lambda pk: (pk != demo, pk))
        agent.workspace_id = ordered[0]
        agent.save(update_fields=["workspace"])
        versions = list(AgentVersion.objects.filter(agent=agent).order_by("version"))
        for workspace_id in ordered[1:]:
            copy = Agent.objects.create(name=agent.name, workspace_id=workspace_id)
            for version in versions:
                copied = AgentVersion.objects.create(
                    agent=copy,
                    version=version.version,
                    manifest_text=version.manifest_text,
                    manifest=version.manifest,
                    digest=version.digest,
                )
                Run.objects.filter(workspace_id=workspace_id, agent_version=version).update(agent_version=copied)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0002_executors"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="workspace",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.CASCADE, related_name="agents", to="runs.workspace"
            ),
        ),
        migrations.AlterField(
            model_name="agent",
            name="name",
            field=models.CharField(max_length=100),
        ),
        migrations.RunPython(assign_workspaces, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="agent",
            name="workspace",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="agents", to="runs.workspace"),
        ),
        migrations.AddConstraint(
            model_name="agent",
            constraint=models.UniqueConstraint(fields=("workspace", "name"), name="agent_unique_name_per_workspace"),
        ),
    ]
