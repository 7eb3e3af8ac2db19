

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workers', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='worker',
            name='request_ref',
            field=models.CharField(editable=False, max_length=36, null=True, unique=True),
        ),
        migrations.AddField(
            model_name='worker',
            name='vm_id',
            field=models.CharField(blank=True, editable=False, max_length=40),
        ),
    ]
