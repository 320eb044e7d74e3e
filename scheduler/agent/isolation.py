"""What a task can reach on its node: the account it runs as, its environment, its directories.

No Django here (the agent runs on machines without the server). The rules, as Slurm's slurmd
applies them to job steps:

1. An agent running as root never runs a task as root: it runs it as the submitting user's Unix
   account of the same name when that is a regular account (uid >= UID_MIN), else under a uid
   of its own from the configured range (`--task-uids`, as systemd's DynamicUser= leases
   one): the same uid for the same user every time, never another user's, never one shared
   account. With `--task-uids off` it falls back to one configured task account (`nobody`
   unless set). An agent that is not root runs tasks as itself (it cannot switch), and says
   so when it starts.
2. A task's environment is built from scratch: the account's PATH/HOME/USER/LOGNAME/SHELL/LANG
   and then what the start message carries (the job's env, BERTH_* variables,
   CUDA_VISIBLE_DEVICES). Nothing of the agent's own environment (DATABASE_URL,
   BERTH_SECRET_KEY, BERTH_JOIN_TOKEN, ...) reaches a task.
3. The command runs as a script file run by `bash -l` when bash exists on the node (a login
   shell: the system's and the account's profile run first, so `module`, conda and the like
   work, and bash syntax such as `[[ ]]` and arrays), else by `/bin/sh`. The script first
   exports the start message's variables again (after the login files, so they still win, PATH
   included), then runs the command. It lives in the task's own work dir, readable by its
   account only: nothing of the command or its variables is on any command line or in any
   other variable of the environment.
4. Directories: the agent's state dir is 0700 and owned by the agent; the work base is 0711
   (tasks may pass through it but not list it); each task's work dir is 0700, owned by the
   task's account, and named with a random part, so that nobody finds another's by guessing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pwd
import re
import secrets
import shlex
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("berth.agent")
DEFAULT_TASK_USER = "nobody"
TASK_PATH = "/usr/local/bin:/usr/bin:/bin"
TASK_LANG = "C.UTF-8"
LOGIN_DEFS = Path("/etc/login.defs")
FALLBACK_SHELL = "/bin/sh"
SCRIPT_NAME = ".berth-command"  # the task's script, in its work dir
SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_TASK_UIDS = (3_000_000, 3_999_999)  # far above login accounts and subuid ranges
NO_HOME = "/nonexistent"  # HOME of a uid from the range whose work dir it cannot reach
UIDS_FILE = "uids.json"  # in the state dir: user name -> the uid it was given here


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    @classmethod
    def from_pwd(cls, entry: pwd.struct_passwd) -> Account:
        try:
            groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        except OSError:
            groups = (entry.pw_gid,)
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/",
                   entry.pw_shell or "/bin/sh")  # fmt: skip


def lookup(name: str) -> Account | None:
    """The Unix account called `name`, or None."""
    if not name or "\0" in name:
        return None
    try:
        return Account.from_pwd(pwd.getpwnam(name))
    except KeyError:
        return None


def current_account() -> Account:
    uid = os.geteuid()
    try:
        return Account.from_pwd(pwd.getpwuid(uid))
    except KeyError:  # a uid without a passwd entry (some containers)
        return Account(str(uid), uid, os.getegid(), (os.getegid(),), "/", "/bin/sh")


def regular_uid_min() -> int:
    """UID_MIN from /etc/login.defs: below it are system accounts (daemon, www-data, ...),
    which a Berth user of the same name must never be mapped to."""
    try:
        for line in LOGIN_DEFS.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "UID_MIN" and parts[1].isdigit():
                return int(parts[1])
    except OSError:
        pass
    return 1000


def parse_uid_range(text: str) -> tuple[int, int] | None:
    """`START-END` (inclusive), or None for "off"; ValueError otherwise."""
    if text.strip().lower() == "off":
        return None
    start, sep, end = text.partition("-")
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        raise ValueError(f"expected START-END or off, got {text!r}")
    low, high = int(start), int(end)
    if not 1000 <= low <= high < 2**32 - 1:
        raise ValueError(f"the range must lie within 1000-{2**32 - 2}, low to high")
    return low, high


class UidMap:
    """A uid of its own for each user without an account here, from a range: the user's name
    hashed into the range, the next free one on a collision; kept in the state dir, so a user
    keeps its uid across restarts and a uid is never handed to two users."""

    def __init__(self, uid_range: tuple[int, int], path: Path) -> None:
        self.low, self.high = uid_range
        self.path = path
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError):
            loaded = {}
        self.uids: dict[str, int] = {
            str(k): v
            for k, v in loaded.items()
            if isinstance(v, int) and self.low <= v <= self.high
        }

    def uid(self, name: str) -> int:
        if name in self.uids:
            return self.uids[name]
        size = self.high - self.low + 1
        if len(self.uids) >= size:
            raise ValueError(f"no uid left in {self.low}-{self.high} for user {name!r}")
        taken = set(self.uids.values())
        start = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % size
        for step in range(size):
            candidate = self.low + (start + step) % size
            if candidate not in taken and not _has_account(candidate):
                break
        else:
            raise ValueError(f"no uid left in {self.low}-{self.high} for user {name!r}")
        self.uids[name] = candidate
        self._save()
        return candidate

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(self.uids))
        tmp.replace(self.path)


class TaskAccounts:
    """Which account runs a given user's task on this machine."""

    def __init__(self, default_user: str = DEFAULT_TASK_USER,
                 uid_range: tuple[int, int] | None = None,
                 state_dir: Path | None = None) -> None:  # fmt: skip
        self.switching = os.geteuid() == 0
        self.own = current_account()
        self.uid_min = regular_uid_min()
        self.default = self.own
        self.uids: UidMap | None = None
        if self.switching and uid_range is not None:
            self.uids = UidMap(uid_range, (state_dir or Path(".")) / UIDS_FILE)
        if self.switching:
            self.default = _task_account(default_user)

    def for_owner(self, owner: object) -> Account:
        """The submitting user's own account when it is a regular one, else a uid of its own
        from the range (or, with no range, the default account)."""
        if not self.switching:
            return self.own
        account = lookup(owner) if isinstance(owner, str) else None
        if account is not None and account.uid >= self.uid_min and account.gid != 0:
            return account
        if self.uids is not None and isinstance(owner, str) and owner and "\0" not in owner:
            uid = self.uids.uid(owner)
            return Account(owner, uid, uid, (uid,), "", FALLBACK_SHELL)
        return self.default

    def describe(self) -> str:
        if self.switching and self.uids is not None:
            return (
                "tasks run as the submitting user's Unix account of the same name (uid >="
                f" {self.uid_min}) when it exists, else under a uid of that user's own from"
                f" {self.uids.low}-{self.uids.high}"
            )
        if self.switching:
            return (
                "tasks run as the submitting user's Unix account of the same name (uid >="
                f" {self.uid_min}) when it exists, else as {self.default.name!r}"
                f" (uid {self.default.uid}), shared by all such users (--task-uids off)"
            )
        return (
            f"not running as root: tasks run as this agent's own user {self.own.name!r}"
            f" (uid {self.own.uid}) and could read its state; run the agent as root to"
            " isolate tasks from it"
        )


def _task_account(name: str) -> Account:
    """The configured shared task account: it must exist and must not be root."""
    account = lookup(name)
    if account is None:
        raise ValueError(
            f"task user {name!r} does not exist on this machine: create it or"
            " choose another with --task-user / BERTH_TASK_USER"
        )
    if account.uid == 0 or account.gid == 0:
        raise ValueError(
            f"task user {name!r} is root (uid/gid 0): tasks never run as root;"
            " choose an unprivileged account with --task-user / BERTH_TASK_USER"
        )
    return account


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def build_env(start_env: Mapping[str, object], account: Account,
              workdir: Path | None = None) -> dict[str, str]:  # fmt: skip
    """A task's whole environment: the account's basics, then the start message's variables
    (the job's env, BERTH_*, CUDA_VISIBLE_DEVICES), which may override them (PATH, LANG). An
    account without a home of its own (a uid from the range) gets `workdir` as HOME (None:
    /nonexistent, as Debian's nobody)."""
    env = {
        "PATH": TASK_PATH,
        "HOME": account.home or str(workdir or NO_HOME),
        "USER": account.name,
        "LOGNAME": account.name,
        "SHELL": account.shell,
        "LANG": TASK_LANG,
    }
    env.update({str(key): str(value) for key, value in start_env.items()})
    return env


def login_bash() -> str | None:
    """bash's path on this node (looked up on the tasks' PATH), or None."""
    return shutil.which("bash", path=TASK_PATH)


def shell_script(command: str, start_env: Mapping[str, object],
                 bash: str | None) -> tuple[list[str], str]:  # fmt: skip
    """The shell with its flags (the script's path goes last) and the script that runs
    `command`. With bash it is a login shell, whose profile may reset variables (Debian's
    /etc/profile sets PATH): the script first exports the start message's variables again."""
    if bash is None:
        return [FALLBACK_SHELL], command
    restore = "".join(
        f"export {key}={shlex.quote(str(value))}\n"
        for key, value in start_env.items()
        if SHELL_NAME.fullmatch(str(key))
    )
    return [bash, "-l"], f"{restore}{command}\n"


def write_script(workdir: Path, text: str, account: Account, switching: bool) -> Path:
    """The task's script in its fresh work dir: its account's alone to read (0500)."""
    path = workdir / SCRIPT_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o500)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        if switching:
            os.fchown(fd, account.uid, account.gid)
        os.fchmod(fd, 0o500)
    return path


def task_dir_name(task_id: int, attempt: int) -> str:
    """A task's work dir name: its id and attempt (for people), and a random part that no
    other user can guess."""
    return f"task-{task_id}-{attempt}-{secrets.token_hex(8)}"


def private_tmp_tools() -> tuple[str, str] | None:
    """`unshare` and `setpriv` (util-linux) when the agent is root and both are here: then each
    task gets a mount namespace of its own with a fresh tmpfs on /tmp."""
    if os.geteuid() != 0:
        return None
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    return (unshare, setpriv) if unshare and setpriv else None


def private_tmp_argv(tools: tuple[str, str], account: Account, size: int) -> list[str]:
    """The start of a task's argv that gives it a private /tmp: a mount namespace of its own
    (as root), a tmpfs of at most `size` bytes (its pages count against the task's memory
    limit) on /tmp, then the account's uid, gid and groups. The namespace, and the tmpfs with
    it, is gone when the task's last process is."""
    unshare, setpriv = tools
    groups = ",".join(str(g) for g in account.groups)
    options = f"mode=1777,nosuid,nodev,size={size}" if size else "mode=1777,nosuid,nodev"
    mount = 'mount -t tmpfs -o "$1" berth-tmp /tmp || exit 125; shift; exec "$@"'
    return [
        unshare, "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", mount, "berth-tmp", options,
        setpriv, f"--reuid={account.uid}", f"--regid={account.gid}",
        f"--groups={groups}" if groups else "--clear-groups", "--",
    ]  # fmt: skip


def spawn_kwargs(account: Account, switching: bool) -> dict[str, Any]:
    """subprocess.Popen arguments that make the child run as `account`."""
    if not switching:
        return {}
    return {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}


def private_dir(path: Path) -> Path:
    """A 0700 directory owned by the agent (its state: tokens, task output, exit codes)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _owned_by_us(path)
    path.chmod(0o700)
    return path


def work_base(path: Path, switching: bool) -> Path:
    """The directory holding task work dirs: tasks may pass through it, not list it."""
    path.mkdir(mode=0o711, parents=True, exist_ok=True)
    _owned_by_us(path)
    if switching:
        path.chmod(0o711)
    return path


def task_workdir(path: Path, account: Account, switching: bool) -> Path:
    """One task's work dir: 0700, owned by the account the task runs as."""
    path.mkdir(mode=0o700)  # new: a dir that exists already (planted) is refused
    if switching:
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
    path.chmod(0o700)
    return path


def task_tmp(workdir: Path, account: Account, switching: bool) -> Path:
    """TMPDIR in the task's work dir, where no private /tmp can be made: gone with it."""
    path = workdir / "tmp"
    path.mkdir(mode=0o700)
    if switching:
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
    return path


def unreachable_ancestor(path: Path, account: Account) -> Path | None:
    """The first directory on the way to `path` that `account` may not pass through (None when
    it can reach it): the task still starts there, but cannot use its absolute path."""
    for directory in [*reversed(path.resolve().parents), path.resolve()]:
        try:
            info = directory.stat()
        except OSError:
            return directory
        if info.st_uid == account.uid:
            bit = stat.S_IXUSR
        elif info.st_gid in account.groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return directory
    return None


def _owned_by_us(path: Path) -> None:
    """Refuse a directory someone else owns (planted in /tmp, say): they could reopen it."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
        owner = _user_name(info.st_uid)
        raise ValueError(f"{path} is owned by {owner}, not by the agent's user: refusing it")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
