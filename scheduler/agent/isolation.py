"""What a task can reach on its node: the account it runs as, its environment, its directories.

No Django here (the agent runs on machines without the server). The rules, as Slurm's slurmd
applies them to job steps:

1. An agent running as root never runs a task as root: it runs it as the submitting user's Unix
   account of the same name when that is a regular account (uid >= UID_MIN), else as the
   configured task account (`nobody` unless set). An agent that is not root runs tasks as
   itself (it cannot switch), and says so when it starts.
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


class TaskAccounts:
    """Which account runs a given user's task on this machine."""

    def __init__(self, default_user: str = DEFAULT_TASK_USER) -> None:
        self.switching = os.geteuid() == 0
        self.own = current_account()
        self.uid_min = regular_uid_min()
        self.default = self.own
        if self.switching:
            account = lookup(default_user)
            if account is None:
                raise ValueError(
                    f"task user {default_user!r} does not exist on this machine: create it or"
                    " choose another with --task-user / BERTH_TASK_USER"
                )
            if account.uid == 0 or account.gid == 0:
                raise ValueError(
                    f"task user {default_user!r} is root (uid/gid 0): tasks never run as root;"
                    " choose an unprivileged account with --task-user / BERTH_TASK_USER"
                )
            self.default = account

    def for_owner(self, owner: object) -> Account:
        """The submitting user's own account when it is a regular one, else the default."""
        if not self.switching:
            return self.own
        account = lookup(owner) if isinstance(owner, str) else None
        if account is not None and account.uid >= self.uid_min and account.gid != 0:
            return account
        return self.default

    def describe(self) -> str:
        if self.switching:
            return (
                "tasks run as the submitting user's Unix account of the same name (uid >="
                f" {self.uid_min}) when it exists, else as {self.default.name!r}"
                f" (uid {self.default.uid})"
            )
        return (
            f"not running as root: tasks run as this agent's own user {self.own.name!r}"
            f" (uid {self.own.uid}) and could read its state; run the agent as root to"
            " isolate tasks from it"
        )


def build_env(start_env: Mapping[str, object], account: Account) -> dict[str, str]:
    """A task's whole environment: the account's basics, then the start message's variables
    (the job's env, BERTH_*, CUDA_VISIBLE_DEVICES), which may override them (PATH, LANG)."""
    env = {
        "PATH": TASK_PATH,
        "HOME": account.home,
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
