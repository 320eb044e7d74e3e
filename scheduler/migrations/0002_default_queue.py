from django.db import migrations


def create_default_queue(apps, schema_editor):  # type: ignore[no-untyped-def]
    Queue = apps.get_model("scheduler", "Queue")
    Queue.objects.get_or_create(name="default", defaults={"weight": 1.0})


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0001_initial")]
    operations = [migrations.RunPython(create_default_queue, migrations.RunPython.noop)]
