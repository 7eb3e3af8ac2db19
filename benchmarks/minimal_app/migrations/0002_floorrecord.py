from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("minimal_app", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="FloorRecord",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("principal", models.CharField(max_length=255)),
                ("key", models.CharField(max_length=255)),
                ("response_status", models.IntegerField(null=True)),
                ("response_body", models.BinaryField(null=True)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("principal", "key"), name="floor_scope_uniq"
                    )
                ]
            },
        ),
    ]
