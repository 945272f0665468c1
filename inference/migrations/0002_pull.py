# Pulling models by name (inference.pulling): the name a model was pulled as, pull jobs and
# the numbers their followers read.

import django.db.models.deletion
import django.db.models.functions.text
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="PulledName",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                ("pulled_at", models.DateTimeField(auto_now=True)),
                (
                    "model",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="pulled_names",
                        to="inference.llmmodel",
                    ),
                ),
            ],
            options={
                "ordering": ["name"],
                "constraints": [
                    models.UniqueConstraint(
                        django.db.models.functions.text.Lower("name"), name="pulled_name_unique"
                    )
                ],
            },
        ),
        migrations.AlterField(
            model_name="llmmodel",
            name="source",
            field=models.CharField(
                choices=[
                    ("scan", "found in the models directory"),
                    ("upload", "uploaded"),
                    ("url", "downloaded"),
                    ("package", "from an installed package"),
                    ("import", "imported with manage.py import_model"),
                    ("pull", "pulled from a model registry"),
                ],
                default="scan",
                max_length=10,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="detail",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AlterField(
            model_name="job",
            name="kind",
            field=models.CharField(
                choices=[
                    ("import", "Import"),
                    ("hash", "Hash"),
                    ("download", "Download"),
                    ("upload", "Upload"),
                    ("benchmark", "Benchmark"),
                    ("pull", "Pull"),
                ],
                max_length=12,
            ),
        ),
    ]
