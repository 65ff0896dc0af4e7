# The test tools' ledgers leave runs for the testtools app, installed only with OZ0_TEST_TOOLS=1
# (their rows are test bookkeeping: a real install keeps neither the rows nor the tables).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0014_idempotency_keys_and_effect_ends'),
    ]

    operations = [
        migrations.DeleteModel(
            name='EffectRecord',
        ),
        migrations.DeleteModel(
            name='FlakyCounter',
        ),
    ]
