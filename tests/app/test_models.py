"""Invariants the database itself guarantees."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from scheduler.models import Allocation, Device, Node, Queue
from tests.factories import make_job, make_node


def _double_allocation(owner) -> None:
    node = make_node("gpu-01", gpus=1)
    first, second = make_job(owner, "first"), make_job(owner, "second")
    device = Device.objects.get(node=node)
    Allocation.objects.create(device=device, task=first.tasks.get())
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(device=device, task=second.tasks.get())
    assert Allocation.objects.get().task.job_id == first.pk


@pytest.mark.django_db
def test_a_device_cannot_be_held_twice(owner):
    _double_allocation(owner)


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_device_cannot_be_held_twice_on_postgres(owner):
    _double_allocation(owner)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "make",
    [
        lambda: Node.objects.create(name="n", cpu=-1, memory=0),
        lambda: Queue.objects.create(name="q", weight=0),
        lambda: (
            Node.objects.create(name="default-twice", cpu=1, memory=1)
            and Node.objects.create(name="default-twice", cpu=1, memory=1)
        ),
    ],
)
def test_the_database_refuses_impossible_rows(make):
    with pytest.raises(IntegrityError):
        make()


@pytest.mark.django_db
def test_a_default_queue_exists_after_migrate():
    assert Queue.objects.filter(name="default").exists()
