from django.db import migrations, models
import django.db.models.deletion


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0008_speculative'),
    ]

    operations = [
        migrations.AddField(
            model_name='llmmodel',
            name='draft',
            field=models.ForeignKey(blank=True, help_text="a small model of the same family that guesses this one's next tokens", null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='drafting_for', to='inference.llmmodel'),
        ),
    ]
