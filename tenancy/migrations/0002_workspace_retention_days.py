from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tenancy", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="workspace",
            name="retention_days",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
