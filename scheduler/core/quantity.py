"""Resource quantities as users write them: cpu 0.5 or "500m", memory "16Gi", gpu 2."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_MEMORY_UNITS = {
    "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}  # fmt: skip
# Checked before any arithmetic: a number is short and its exponent small, so "1e1000000" is
# refused at once instead of becoming a million-digit integer.
MAX_TEXT = 32
MAX_ADJUSTED_EXPONENT = 18
QUANTITY_MAX = 2**62  # millicores, bytes or devices: far beyond any cluster, fits a bigint
_NUMBER_RE = re.compile(r"^[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?$|^[0-9]+\.$")
_MEMORY_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kMGTP]i?|)\s*$")


def _decimal(value: object, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ValueError(f"{what} must be a number, got {_show(value)}")
    if isinstance(value, int) and abs(value) > QUANTITY_MAX:  # before str(): it may be huge
        raise ValueError(f"{what} is out of range")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {_show(value)}")
    text = (str(value) if not isinstance(value, str) else value).strip()
    if len(text) > MAX_TEXT:
        raise ValueError(f"{what} is too long a number ({len(text)} characters)")
    if text.startswith("-"):
        raise ValueError(f"{what} must not be negative, got {_show(value)}")
    if not _NUMBER_RE.match(text):
        raise ValueError(f"{what} must be a number, got {_show(value)}")
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"{what} must be a number, got {_show(value)}") from None
    if number and abs(number.adjusted()) > MAX_ADJUSTED_EXPONENT:
        raise ValueError(f"{what} is out of range, got {_show(value)}")
    return number


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."


def _bounded(amount: int, what: str, value: object) -> int:
    if amount > QUANTITY_MAX:
        raise ValueError(f"{what} is out of range, got {_show(value)}")
    return amount


def parse_cpu(value: object) -> int:
    """Cores as a number or string ("0.5", 2) or millicores ("500m") -> millicores."""
    if isinstance(value, str) and value.strip().endswith("m"):
        milli = _decimal(value.strip()[:-1], "cpu")
        if milli != milli.to_integral_value():
            raise ValueError(f"cpu in millicores must be whole, got {_show(value)}")
        return _bounded(int(milli), "cpu", value)
    cores = _decimal(value, "cpu")
    milli = cores * 1000
    if milli != milli.to_integral_value():
        raise ValueError(f"cpu must be a multiple of 0.001 cores, got {_show(value)}")
    return _bounded(int(milli), "cpu", value)


def parse_memory(value: object) -> int:
    """Bytes as an integer or a string with a unit ("512Mi", "16Gi", "1G") -> bytes."""
    if isinstance(value, bool):
        raise ValueError(f"memory must be bytes or a size like 16Gi, got {_show(value)}")
    if isinstance(value, int | float):
        return _whole_bytes(_decimal(value, "memory"), value)
    if not isinstance(value, str):
        raise ValueError(f"memory must be bytes or a size like 16Gi, got {_show(value)}")
    if len(value) > MAX_TEXT:
        raise ValueError(f"memory is too long a size ({len(value)} characters)")
    if value.strip().startswith("-"):
        raise ValueError(f"memory must not be negative, got {_show(value)}")
    match = _MEMORY_RE.match(value)
    if not match:
        raise ValueError(f"memory must be bytes or a size like 512Mi or 16Gi, got {_show(value)}")
    number, unit = match.groups()
    return _whole_bytes(_decimal(number, "memory") * _MEMORY_UNITS[unit], value)


def _whole_bytes(size: Decimal, value: object) -> int:
    if size > QUANTITY_MAX:
        raise ValueError(f"memory is out of range, got {_show(value)}")
    if size != size.to_integral_value():
        raise ValueError(f"memory must be a whole number of bytes, got {_show(value)}")
    return int(size)


def parse_gpu(value: object) -> int:
    """A count of whole devices."""
    number = _decimal(value, "gpu")
    if number != number.to_integral_value():
        raise ValueError(f"gpu must be a whole number of devices, got {_show(value)}")
    return _bounded(int(number), "gpu", value)


GPU_MILLI = 1000  # one whole device, in the thousandths a fraction is counted in


def parse_gpu_request(value: object) -> tuple[int, int]:
    """A GPU request -> (devices, share in thousandths of one device): whole devices as
    (n, 0); a fraction of one device (0 < x < 1, a multiple of 0.001) as (1, x * 1000). A
    fraction never spans devices, so 1.5 is refused."""
    number = _decimal(value, "gpu")
    if number == number.to_integral_value():
        return _bounded(int(number), "gpu", value), 0
    if number > 1:
        raise ValueError(
            f"gpu above 1 must be a whole number of devices (a fraction is of one device and"
            f" never spans devices), got {_show(value)}"
        )
    milli = number * GPU_MILLI
    if milli != milli.to_integral_value() or milli < 1:
        raise ValueError(f"gpu must be a multiple of 0.001 of a device, got {_show(value)}")
    return 1, int(milli)


# A MIG profile as nvidia-smi names it: "1g.10gb", "3g.40gb", a compute instance smaller
# than its GPU instance "1c.3g.40gb", media extensions "1g.10gb+me" (docs/gpus.md).
MIG_PROFILE_RE = re.compile(
    r"^(?:[1-7]c\.)?([1-7])g\.[0-9]{1,4}gb(?:[+-][a-z]{1,8}(?:\.[a-z]{1,8})?)?$"
)
MIG_SLICES = 7  # compute slices of a whole A100/H100: a MIG instance counts as its g / 7


def parse_mig_profile(value: object) -> str | None:
    """The MIG profile `value` names (lower case), or None when it is no profile-like text
    (a number: `parse_gpu_request` reads it). ValueError for text that is neither."""
    if not isinstance(value, str) or _NUMBER_RE.match(value.strip().lstrip("-")):
        return None
    profile = value.strip().lower()
    if len(profile) > MAX_TEXT or not MIG_PROFILE_RE.match(profile):
        raise ValueError(
            f"gpu must be a number of GPUs, a fraction of one (0.25) or a MIG profile such as"
            f" 1g.10gb, got {_show(value)}"
        )
    return profile


def mig_share(profile: str) -> int:
    """What a MIG instance of `profile` counts as, in thousandths of its GPU: its GPU
    instance's compute slices of seven, rounded down (so seven 1g instances never add up
    past one GPU); a 7g instance is the whole GPU."""
    match = MIG_PROFILE_RE.match(profile)
    slices = int(match.group(1)) if match else MIG_SLICES
    return GPU_MILLI * slices // MIG_SLICES


def gpu_milli(devices: int, share: int) -> int:
    """A GPU request or holding in thousandths of one GPU, as limits and quotas sum it:
    whole devices 1000 each, a fraction its share, a MIG instance its share (`mig_share`)."""
    return share or devices * GPU_MILLI


def parse_gpu_field(value: object) -> tuple[int, int, str]:
    """A spec's `gpu` -> (whole devices, share in thousandths, MIG profile): `gpu: 2` is
    (2, 0, ""), `gpu: 0.25` (1, 250, ""), `gpu: "1g.10gb"` (0, 142, "1g.10gb"): a MIG
    instance is no whole device, it counts as its share (`mig_share`)."""
    profile = parse_mig_profile(value)
    if profile is not None:
        return 0, mig_share(profile), profile
    devices, share = parse_gpu_request(value)
    return devices, share, ""


def format_gpu(devices: int, share: int) -> int | float:
    """The request as people write it: whole devices as an integer, a fraction as 0.25."""
    return share / GPU_MILLI if share else devices


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
