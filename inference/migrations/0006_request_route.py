from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0005_derived_models'),
    ]

    operations = [
        migrations.AddField(
            model_name='requestrecord',
            name='worker',
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name='requestrecord',
            name='route',
            field=models.CharField(blank=True, max_length=32),
        ),
    ]
