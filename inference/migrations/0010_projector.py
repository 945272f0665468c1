import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0009_draft_model'),
    ]

    operations = [
        migrations.CreateModel(
            name='Projector',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('file_path', models.CharField(max_length=1000, unique=True)),
                ('size_bytes', models.BigIntegerField(default=0)),
                ('sha256', models.CharField(blank=True, max_length=64)),
                ('source', models.CharField(default='scan', max_length=10)),
                ('projector_type', models.CharField(max_length=32)),
                ('projection_dim', models.PositiveIntegerField()),
                ('image_size', models.PositiveIntegerField()),
                ('patch_size', models.PositiveIntegerField()),
                ('metadata', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'ordering': ['file_path'],
            },
        ),
        migrations.AddField(
            model_name='llmmodel',
            name='projector',
            field=models.ForeignKey(blank=True, help_text='a vision projector (mmproj) GGUF made for this model: it then takes images', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='models', to='inference.projector'),
        ),
        migrations.RemoveConstraint(
            model_name='llmmodel',
            name='one_entry_per_weights_file',
        ),
        migrations.AddConstraint(
            model_name='llmmodel',
            constraint=models.UniqueConstraint(condition=models.Q(('base__isnull', True), ('projector__isnull', True)), fields=('file_path',), name='one_entry_per_weights_file'),
        ),
        migrations.AddConstraint(
            model_name='llmmodel',
            constraint=models.UniqueConstraint(condition=models.Q(('base__isnull', True), ('projector__isnull', False)), fields=('file_path', 'projector'), name='one_entry_per_weights_and_projector'),
        ),
    ]
