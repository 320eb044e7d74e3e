"""What the agent leaves on disk, bounded (Django-free): the output it has shipped is freed
from its copy as it goes, a task's copy is deleted once the server has its end, and task work
dirs are removed after a retention time."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("berth.agent")
DEFAULT_KEEP_WORK_DIRS = 24 * 3600.0  # seconds an ended task's work dir is kept
SWEEP_SECONDS = 60.0  # how often work dirs are looked at (at most)
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
BLOCK = 4096
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def free_shipped(path: Path, shipped: int) -> None:
    """Give back the disk blocks of output the server already has (the file keeps its size,
    so offsets stay valid): the agent's copy then holds only what is not shipped yet."""
    length = shipped // BLOCK * BLOCK
    if length <= 0:
        return
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return
    try:
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        _libc.fallocate(fd, mode, ctypes.c_long(0), ctypes.c_long(length))
    finally:
        os.close(fd)


def remove_task_files(directory: Path) -> None:
    """The agent's copy of an ended task's output and its exit code, once the server has
    both."""
    shutil.rmtree(directory, ignore_errors=True)


def sweep_work_dirs(base: Path, keep_seconds: float, in_use: Iterable[str]) -> list[Path]:
    """Remove task work dirs not in use whose last change is older than `keep_seconds`;
    returns those removed. (rmtree does not follow a task's symlinks out of its dir.)"""
    busy = {Path(p).name for p in in_use}
    removed: list[Path] = []
    cutoff = time.time() - keep_seconds
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith("task-") or entry.name in busy:
            continue
        try:
            info = entry.lstat()
        except OSError:
            continue
        if info.st_mtime <= cutoff and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
