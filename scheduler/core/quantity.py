"""Resource quantities as users write them: cpu 0.5 or "500m", memory "16Gi", gpu 2."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_MEMORY_UNITS = {
    "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}  # fmt: skip
_MEMORY_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kMGTP]i?|)\s*$")


def _decimal(value: object, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ValueError(f"{what} must be a number, got {value!r}")
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not number.is_finite():
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if number < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return number


def parse_cpu(value: object) -> int:
    """Cores as a number or string ("0.5", 2) or millicores ("500m") -> millicores."""
    if isinstance(value, str) and value.strip().endswith("m"):
        milli = _decimal(value.strip()[:-1], "cpu")
        if milli != milli.to_integral_value():
            raise ValueError(f"cpu in millicores must be whole, got {value!r}")
        return int(milli)
    cores = _decimal(value, "cpu")
    milli = cores * 1000
    if milli != milli.to_integral_value():
        raise ValueError(f"cpu must be a multiple of 0.001 cores, got {value!r}")
    return int(milli)


def parse_memory(value: object) -> int:
    """Bytes as an integer or a string with a unit ("512Mi", "16Gi", "1G") -> bytes."""
    if isinstance(value, bool):
        raise ValueError(f"memory must be bytes or a size like 16Gi, got {value!r}")
    if isinstance(value, int | float):
        return _whole_bytes(_decimal(value, "memory"), value)
    if not isinstance(value, str):
        raise ValueError(f"memory must be bytes or a size like 16Gi, got {value!r}")
    if value.strip().startswith("-"):
        raise ValueError(f"memory must not be negative, got {value!r}")
    match = _MEMORY_RE.match(value)
    if not match:
        raise ValueError(f"memory must be bytes or a size like 512Mi or 16Gi, got {value!r}")
    number, unit = match.groups()
    return _whole_bytes(Decimal(number) * _MEMORY_UNITS[unit], value)


def _whole_bytes(size: Decimal, value: object) -> int:
    if size != size.to_integral_value():
        raise ValueError(f"memory must be a whole number of bytes, got {value!r}")
    return int(size)


def parse_gpu(value: object) -> int:
    """A count of whole devices."""
    number = _decimal(value, "gpu")
    if number != number.to_integral_value():
        raise ValueError(f"gpu must be a whole number of devices, got {value!r}")
    return int(number)


def format_cpu(milli: int) -> str:
    if milli % 1000 == 0:
        return str(milli // 1000)
    if milli % 100 == 0 or milli % 10 == 0:
        return str(Decimal(milli) / 1000)
    return f"{milli}m"


def format_memory(size: int) -> str:
    for unit in ("Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = _MEMORY_UNITS[unit]
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)
