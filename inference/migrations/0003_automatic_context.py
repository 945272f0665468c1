# A model's context per sequence is automatic by default (n_ctx 0: sized at each load from its
# training context and the memory estimate, inference.preflight). Records still holding the
# old import default, min(2048, training context), become automatic too: that value was never
# chosen by anyone, and kept it would hold the starter model (trained for 8192) at 2048. A
# setting someone saved with exactly that value cannot be told apart and becomes automatic;
# any other setting stays as it was.

from django.db import migrations, models

OLD_DEFAULT = 2048


def to_automatic(apps, schema_editor):
    LLMModel = apps.get_model("inference", "LLMModel")
    for model in LLMModel.objects.all().only("pk", "n_ctx", "context_length"):
        old_default = min(OLD_DEFAULT, model.context_length or OLD_DEFAULT)
        if model.n_ctx == old_default:
            LLMModel.objects.filter(pk=model.pk).update(n_ctx=0)


def to_explicit(apps, schema_editor):
    LLMModel = apps.get_model("inference", "LLMModel")
    for model in LLMModel.objects.filter(n_ctx=0).only("pk", "context_length"):
        old_default = min(OLD_DEFAULT, model.context_length or OLD_DEFAULT)
        LLMModel.objects.filter(pk=model.pk).update(n_ctx=old_default)


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0002_pull"),
    ]

    operations = [
        migrations.AlterField(
            model_name="llmmodel",
            name="n_ctx",
            field=models.PositiveIntegerField(
                default=0,
                help_text="context tokens per sequence; 0: automatic (inference.preflight)",
            ),
        ),
        migrations.RunPython(to_automatic, to_explicit),
    ]
