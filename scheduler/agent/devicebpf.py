"""Device access on cgroup v2: an eBPF program on each task's cgroup (Django-free).

Cgroup v2 has no devices.allow file: the kernel asks the BPF_PROG_TYPE_CGROUP_DEVICE programs
attached to a cgroup (and, where they allow it, to its ancestors) on every open and mknod of a
device node, and refuses unless each of them returns 1. runc and crun compile a container's
device list into such a program; this module does the same for a task, with the bpf(2) system
call through ctypes (no compiler, no libbpf):

1. `parse()` reads the rules in devices.allow syntax ("c 195:0 rwm", "c 136:* rwm"), so v1
   and v2 share one allowlist (scheduler/agent/cgroups.py: BASE_DEVICES and the task's GPUs).
2. `assemble()` turns them into instructions: load the device type, access and numbers from
   the context, then one block per rule that returns 1 when everything matches; 0 at the end.
3. `attach()` loads the program (BPF_PROG_LOAD) and attaches it to the cgroup's directory
   (BPF_PROG_ATTACH, BPF_CGROUP_DEVICE) with no flags, then closes both descriptors: the cgroup
   holds the program until it is removed, so nothing needs detaching when a task ends.

No flags (rather than BPF_F_ALLOW_MULTI) means: a task cgroup has exactly one device program,
attaching again (a cgroup made again after a restart) replaces it instead of stacking a second,
and nothing below the task cgroup can attach a program of its own. Programs on ancestors
attached with BPF_F_ALLOW_MULTI (systemd's DeviceAllow=) still run too, and a device is then
allowed only when all of them allow it: the task gets at most what its ancestors give. An
ancestor's program attached with BPF_F_ALLOW_OVERRIDE is replaced by the task's for the task,
and one attached with no flags forbids any below it (EPERM: `probe()` then says devices cannot
be enforced). The license string does not matter: the program calls no kernel helper, and only
GPL-only helpers need "GPL".
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# bpf(2) commands, the program type and the attach type (include/uapi/linux/bpf.h)
BPF_PROG_LOAD, BPF_PROG_ATTACH, BPF_PROG_DETACH, BPF_PROG_QUERY = 5, 8, 9, 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}
# struct bpf_cgroup_dev_ctx: access_type = (access << 16) | type, then major, minor
ACCESS = {"m": 1, "r": 2, "w": 4}  # BPF_DEVCG_ACC_MKNOD, _READ, _WRITE
ALL_ACCESS = 7
KINDS = {"b": 1, "c": 2}  # BPF_DEVCG_DEV_BLOCK, _CHAR; "a" is either
LICENSE = b"Berth"
PROBE_NAME = ".berth-devices-probe"
# instruction opcodes (class | operation | source)
LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
AND_K, RSH_K, MOV_K = 0x57, 0x77, 0xB7  # BPF_ALU64 | BPF_AND/BPF_RSH/BPF_MOV | BPF_K
JNE_K, JSET_K, EXIT = 0x55, 0x45, 0x95  # BPF_JMP | BPF_JNE/BPF_JSET | BPF_K; BPF_EXIT


@dataclass(frozen=True)
class Rule:
    """One allowed kind of access: type "c", "b" or "a" (both); major/minor None for any."""

    kind: str
    major: int | None
    minor: int | None
    access: int  # ACCESS bits


class BpfError(OSError):
    """bpf(2) refused: errno and what it means here."""


def parse(text: str) -> Rule:
    """A devices.allow line: "c 1:3 rwm", "c 136:* rwm", "b *:* m" or "a"."""
    parts = text.split()
    if parts == ["a"]:
        return Rule("a", None, None, ALL_ACCESS)
    if len(parts) != 3 or parts[0] not in (*KINDS, "a") or parts[1].count(":") != 1:
        raise ValueError(f"not a device rule: {text!r}")
    major, minor = (None if n == "*" else int(n) for n in parts[1].split(":"))
    if set(parts[2]) - set(ACCESS) or not parts[2]:
        raise ValueError(f"not a device access ('r', 'w', 'm'): {text!r}")
    return Rule(parts[0], major, minor, sum(ACCESS[c] for c in set(parts[2])))


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """struct bpf_insn: opcode, dst and src registers in one byte, s16 offset, s32 immediate."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def assemble(rules: Iterable[Rule]) -> bytes:
    """The program: r2 = device type, r3 = access asked, r4 = major, r5 = minor; each rule a
    block returning 1 on a match and jumping past itself otherwise; 0 (denied) after the last."""
    code = [
        _insn(LDX_W, 2, 1, 0),
        _insn(AND_K, 2, imm=0xFFFF),
        _insn(LDX_W, 3, 1, 0),
        _insn(RSH_K, 3, imm=16),
        _insn(LDX_W, 4, 1, 4),
        _insn(LDX_W, 5, 1, 8),
    ]
    for rule in rules:
        block = _block(rule)
        code += block
        if len(block) == 2:  # allows everything: what follows is unreachable, which the
            return b"".join(code)  # verifier refuses
    code += [_insn(MOV_K, 0, imm=0), _insn(EXIT)]
    return b"".join(code)


def _block(rule: Rule) -> list[bytes]:
    tests: list[tuple[int, int, int]] = []  # (opcode, register, immediate): jump out if true
    if rule.kind != "a":
        tests.append((JNE_K, 2, KINDS[rule.kind]))
    if rule.access != ALL_ACCESS:  # any bit asked that the rule does not give
        tests.append((JSET_K, 3, ALL_ACCESS & ~rule.access))
    if rule.major is not None:
        tests.append((JNE_K, 4, rule.major))
    if rule.minor is not None:
        tests.append((JNE_K, 5, rule.minor))
    count = len(tests)  # each jump lands just after this block's exit
    jumps = [_insn(op, reg, off=count - i + 1, imm=imm) for i, (op, reg, imm) in enumerate(tests)]
    return [*jumps, _insn(MOV_K, 0, imm=1), _insn(EXIT)]


# --- the system call -------------------------------------------------------------------


class _LoadAttr(ctypes.Structure):
    """The BPF_PROG_LOAD part of union bpf_attr, up to expected_attach_type."""

    _fields_ = [
        ("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32), ("expected_attach_type", ctypes.c_uint32),
    ]  # fmt: skip


class _AttachAttr(ctypes.Structure):
    """BPF_PROG_ATTACH and BPF_PROG_DETACH."""

    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_bpf_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32)]  # fmt: skip


class _QueryAttr(ctypes.Structure):
    """BPF_PROG_QUERY."""

    _fields_ = [
        ("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64), ("prog_cnt", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
    ]  # fmt: skip


def _bpf(command: int, attr: ctypes.Structure, what: str) -> int:
    number = SYS_BPF.get(platform.machine())
    if number is None:
        raise BpfError(errno.ENOSYS, f"{what}: no bpf(2) number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = int(libc.syscall(ctypes.c_long(number), ctypes.c_int(command),
                              ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr))))  # fmt: skip
    if result < 0:
        code = ctypes.get_errno()
        raise BpfError(code, f"{what}: {_meaning(code)}")
    return result


def _meaning(code: int) -> str:
    return {
        errno.ENOSYS: "this kernel has no bpf(2)",
        errno.EPERM: "not permitted (it needs CAP_SYS_ADMIN, or CAP_BPF and CAP_NET_ADMIN, and no"
        " ancestor cgroup's device program attached without BPF_F_ALLOW_OVERRIDE or"
        " BPF_F_ALLOW_MULTI; before Linux 5.11, also room under RLIMIT_MEMLOCK)",
        errno.EINVAL: "refused (a kernel without cgroup device programs: Linux 4.15+ with"
        " CONFIG_CGROUP_BPF, or a program the verifier rejects)",
        errno.EBADF: "not a cgroup v2 directory",
    }.get(code, os.strerror(code))


def _unlimit_memlock() -> None:
    """Kernels before 5.11 charge each loaded program to the loader's locked memory under
    RLIMIT_MEMLOCK (root included, shared with every other root BPF user): with the common
    64 KiB limit, starts would fail at about the sixteenth running task. Raise it as libbpf
    does: to unlimited, else (no CAP_SYS_RESOURCE) to the hard limit."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    for limits in ((resource.RLIM_INFINITY,) * 2, (hard, hard)):  # unlimited, or all we may
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, limits)
            return
        except (ValueError, OSError):
            continue


def load(rules: Iterable[Rule]) -> int:
    """Load the program for these rules; its file descriptor (the caller closes it)."""
    if resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] != resource.RLIM_INFINITY:
        _unlimit_memlock()
    program = ctypes.create_string_buffer(assemble(rules))
    license = ctypes.create_string_buffer(LICENSE)
    attr = _LoadAttr(
        prog_type=BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt=(len(program) - 1) // 8,  # create_string_buffer adds a NUL
        insns=ctypes.addressof(program),
        license=ctypes.addressof(license),
        prog_name=b"berth_devices",
    )
    try:
        return _bpf(BPF_PROG_LOAD, attr, "loading the device program")
    except BpfError as exc:
        if exc.errno not in (errno.EINVAL, errno.EACCES):
            raise
        log = ctypes.create_string_buffer(1 << 16)  # again, for the verifier's words
        attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
        try:
            return _bpf(BPF_PROG_LOAD, attr, "loading the device program")
        except BpfError:
            verifier = log.value.decode(errors="replace").strip().splitlines()[-3:]
            raise BpfError(exc.errno, f"{exc.strerror} {' / '.join(verifier)}".strip()) from exc


def attach(cgroup: Path, rules: Iterable[str]) -> None:
    """Allow the processes of `cgroup` these devices (devices.allow lines) and no other."""
    program = load(parse(r) for r in rules)
    try:
        directory = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            attr = _AttachAttr(target_fd=directory, attach_bpf_fd=program,
                               attach_type=BPF_CGROUP_DEVICE)  # fmt: skip
            _bpf(BPF_PROG_ATTACH, attr, f"attaching the device program to {cgroup}")
        finally:
            os.close(directory)
    finally:
        os.close(program)  # the cgroup keeps its own reference


def detach(cgroup: Path) -> None:
    """Remove the device program from `cgroup` (attached with no flags: there is one)."""
    directory = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        attr = _AttachAttr(target_fd=directory, attach_type=BPF_CGROUP_DEVICE)
        _bpf(BPF_PROG_DETACH, attr, f"detaching the device program from {cgroup}")
    finally:
        os.close(directory)


def attached(cgroup: Path) -> int:
    """How many device programs are attached to `cgroup` itself."""
    directory = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        attr = _QueryAttr(target_fd=directory, attach_type=BPF_CGROUP_DEVICE)
        _bpf(BPF_PROG_QUERY, attr, f"querying the device programs of {cgroup}")
        return int(attr.prog_cnt)
    finally:
        os.close(directory)


def probe(parent: Path, rules: Iterable[str]) -> str:
    """Whether task cgroups under `parent` can get a device program: "" when they can, else
    why not. Tries it on a child cgroup made for the purpose and removed again."""
    child = parent / PROBE_NAME
    try:
        child.mkdir(exist_ok=True)
    except OSError as exc:
        return f"cannot make {child}: {exc.strerror}"
    try:
        attach(child, rules)
        detach(child)
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        try:
            child.rmdir()
        except OSError:
            pass
    return ""
