from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0009_device_samples")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="queue_position",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("queue_position__isnull", False)),
                fields=["queue_position"],
                name="job_queued",
            ),
        ),
    ]
