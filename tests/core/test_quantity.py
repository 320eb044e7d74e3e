"""Quantities as users write them, and exact resource arithmetic."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler.core.quantity import format_cpu, format_memory, parse_cpu, parse_gpu, parse_memory
from scheduler.core.resources import Resources


@pytest.mark.parametrize(
    ("value", "milli"),
    [("0.5", 500), (2, 2000), ("500m", 500), (0.25, 250), ("1.5", 1500), ("0", 0)],
)
def test_it_parses_cpu_to_millicores(value: object, milli: int) -> None:
    assert parse_cpu(value) == milli


@pytest.mark.parametrize(
    ("value", "size"),
    [("16Gi", 16 << 30), ("512Mi", 512 << 20), ("1G", 10**9), ("1.5Gi", 3 << 29), (1024, 1024)],
)
def test_it_parses_memory_to_bytes(value: object, size: int) -> None:
    assert parse_memory(value) == size


@pytest.mark.parametrize(
    ("parse", "value", "message"),
    [
        (parse_cpu, "-1", "cpu must not be negative"),
        (parse_cpu, "lots", "cpu must be a number"),
        (parse_cpu, "0.0001", "cpu must be a multiple of 0.001 cores"),
        (parse_cpu, True, "cpu must be a number"),
        (parse_memory, "-1Gi", "memory must not be negative"),
        (parse_memory, "12Q", "memory must be bytes or a size like 512Mi or 16Gi"),
        (parse_memory, 1.5, "memory must be a whole number of bytes"),
        (parse_memory, -5, "memory must not be negative"),
        (parse_gpu, 1.5, "gpu must be a whole number"),
        (parse_gpu, "1.5", "gpu must be a whole number"),
        (parse_gpu, -1, "gpu must not be negative"),
    ],
)
def test_it_rejects_bad_quantities_with_a_clear_message(
    parse: Callable[[object], int], value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse(value)


def test_it_formats_quantities_back() -> None:
    assert [format_cpu(2000), format_cpu(500), format_cpu(1)] == ["2", "0.5", "1m"]
    assert [format_memory(16 << 30), format_memory(512 << 20), format_memory(1000)] == [
        "16Gi",
        "512Mi",
        "1000",
    ]


def test_it_does_exact_resource_arithmetic() -> None:
    a = Resources(cpu=parse_cpu("0.5"), memory=parse_memory("1Gi"), gpu=1)
    b = Resources(cpu=1500, memory=1 << 30, gpu=1)
    assert a + b == Resources(2000, 2 << 30, 2)
    assert b - a == Resources(1000, 0, 0)
    assert a.fits_in(b) and not b.fits_in(a)
    assert (a - a).is_zero() and not a.is_zero()


@pytest.mark.parametrize("parse", [parse_cpu, parse_memory, parse_gpu])
@pytest.mark.parametrize(
    "value",
    ["1e300000", "1e1000000", "1e-99999999", pytest.param("9" * 1_000_000, id="digits"),
     pytest.param(10**5000, id="bigint"), 2**62 + 1, 1e300,
     float("inf"), float("nan"), "Infinity", "1_000", "0x10", "1e19"],
)  # fmt: skip
def test_huge_or_odd_numbers_are_refused_before_any_arithmetic(
    parse: Callable[[object], int], value: object
) -> None:
    with pytest.raises(ValueError) as error:
        parse(value)
    assert len(str(error.value)) < 120  # the value is never echoed in full


def test_a_whole_quantity_up_to_the_bound_is_kept() -> None:
    assert parse_gpu(2**62) == 2**62
    assert parse_cpu("1e6") == 10**9
    assert parse_memory("1024Pi") == 2**60
