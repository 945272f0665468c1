# The models page (issue 11): a failed or cancelled job can be dismissed from the list, and a
# model remembers when a load-time setting last changed, so a model loaded before then is
# shown as running older settings, with "apply and reload".

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0003_automatic_context"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="dismissed",
            field=models.BooleanField(default=False, help_text="an ended job hidden from the page"),
        ),
        migrations.AddField(
            model_name="llmmodel",
            name="load_settings_changed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
