"""Terminal sessions on the node (docs/interactive.md): a pseudo-terminal in a running task's
context, relayed to the server over a websocket the agent opens itself (outbound only: a node
listens on no port). Django-free, like the rest of the node.

A session's process is the task's in every way the agent can make it:

1. the task's account: uid, gid and groups read from its first process (/proc/<pid>/status),
   switched to with setpriv as the task's own start does;
2. the task's environment: read from that process (/proc/<pid>/environ), so its BERTH_*,
   CUDA_VISIBLE_DEVICES and the job's variables, plus TERM;
3. the task's cgroup: its first process is put there before it runs anything (the same gate
   as a task's start), so it is held to the job's memory, CPU, pids and devices and counted
   as the job, and killed with it;
4. the task's mount namespace (its private /tmp), entered with nsenter when the agent is root
   and the task has one; the task's work dir as its cwd.

The command (or the account's interactive shell) runs from a script file in the task's work
dir, readable by its account alone: no session text on any command line.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shlex
import shutil
import signal
import subprocess
import termios
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.agent.fence import start_gated
from scheduler.agent.isolation import SHELL_NAME
from scheduler.agent.wire import (
    PROTOCOL,
    PROTOCOL_HEADER,
    TERMINAL_FRAME_BYTES,
    TERMINAL_PATH,
    TERMINAL_WINDOW,
    TerminalOrder,
    terminal_size,
)

log = logging.getLogger("berth.agent")
# The session's first process waits on its stdin (a pipe) until the agent has put it in the
# task's cgroup, then opens its terminal by path: as a session leader without one, that makes
# it its controlling terminal (job control, Ctrl-C as SIGINT to the foreground program).
GATE = 'read _ || exit 125; exec 0<>"$1" 1>&0 2>&0; shift; exec "$@"'
HANGUP_GRACE = 2.0  # seconds between SIGHUP and SIGKILL when a session is hung up
BASICS = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG"}  # what a login shell resets


@dataclass(frozen=True)
class TaskContext:
    """What a session needs of its task: its first process, cgroup and work dir, and
    whether it has a mount namespace of its own."""

    pid: int
    cgroup: str
    workdir: str
    private_mounts: bool


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]
    env: dict[str, str]


def task_identity(pid: int, proc: Path = Path("/proc")) -> Identity:
    """The account and environment of the task's process `pid` (OSError if it is gone)."""
    status = (proc / str(pid) / "status").read_text()
    fields = {k: v.split() for k, _, v in (line.partition(":") for line in status.splitlines())}
    raw = (proc / str(pid) / "environ").read_bytes()
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep and key:
            env[key] = value
    groups = tuple(int(g) for g in fields.get("Groups", []))
    return Identity(int(fields["Uid"][1]), int(fields["Gid"][1]), groups, env)


def session_script(command: str, env: dict[str, str], bash: str | None) -> str:
    """The script a session runs with `bash -l` (a login shell, as the task's own): the task's
    variables exported again after the profile, then `command` or an interactive shell."""
    restore = "".join(
        f"export {key}={shlex.quote(value)}\n"
        for key, value in env.items()
        if SHELL_NAME.fullmatch(key) and key not in BASICS
    )
    shell = f"exec {bash} -i" if bash else "exec /bin/sh -i"
    return f"{restore}{command.strip() or shell}\n"


def session_argv(context: TaskContext, who: Identity, script: Path, root: bool) -> list[str]:
    """The session's argv after the gate: into the task's mount namespace and account (as
    root), then its shell running `script`."""
    bash = shutil.which("bash", path="/usr/local/bin:/usr/bin:/bin")
    shell = [bash, "-l"] if bash else ["/bin/sh"]
    # Relative to its work dir (its cwd): the path there may not exist in the task's mount
    # namespace (a work dir under /tmp, hidden by its private /tmp), as for its own script.
    argv = [*shell, f"./{script.name}"]
    if not root:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise OSError("setpriv (util-linux) is needed to run a session as the task's account")
    groups = ",".join(str(g) for g in who.groups)
    argv = [setpriv, f"--reuid={who.uid}", f"--regid={who.gid}",
            f"--groups={groups}" if groups else "--clear-groups", "--", *argv]  # fmt: skip
    nsenter = shutil.which("nsenter")
    if context.private_mounts and nsenter is not None:
        # --wd alone: the task's own cwd (its work dir), seen from inside its namespace.
        argv = [nsenter, f"--target={context.pid}", "--mount", "--wd", "--", *argv]
    return argv


def set_size(fd: int, rows: int, cols: int) -> None:
    termios.tcsetwinsize(fd, (rows, cols))


def exit_status(code: int) -> int:
    """A process's end as a shell says it: its code, or 128 + the signal that killed it."""
    return code if code >= 0 else 128 - code


class Pty:
    """The session's process on a pseudo-terminal, in the task's context."""

    def __init__(self, order: TerminalOrder, context: TaskContext,
                 add_to_cgroup: Callable[[str, int], None]) -> None:  # fmt: skip
        self.order = order
        self.root = os.geteuid() == 0
        who = task_identity(context.pid)
        bash = shutil.which("bash", path=who.env.get("PATH") or "/usr/bin:/bin")
        self.script = Path(context.workdir) / f".berth-session-{order.session[:16]}"
        self._write_script(session_script(order.command, who.env, bash), who)
        self.master, slave = os.openpty()
        try:
            tty = os.ttyname(slave)
            set_size(slave, order.rows, order.cols)
            if self.root:
                os.chown(tty, who.uid, -1)
                os.chmod(tty, 0o620)
            env = {**who.env, "TERM": order.term}
            self.proc = self._spawn(context, who, tty, slave, env, add_to_cgroup)
        finally:
            os.close(slave)

    def _write_script(self, text: str, who: Identity) -> None:
        fd = os.open(self.script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o500)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            if self.root:
                os.fchown(fd, who.uid, who.gid)
            os.fchmod(fd, 0o500)

    def _spawn(self, context: TaskContext, who: Identity, tty: str, slave: int,
               env: dict[str, str], add_to_cgroup: Callable[[str, int], None],
               ) -> subprocess.Popen[bytes]:  # fmt: skip
        argv = session_argv(context, who, self.script, self.root)

        def start(gate: int) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                ["/bin/sh", "-c", GATE, "berth-session", tty, *argv],
                cwd=context.workdir, env=env, stdin=gate, stdout=slave, stderr=slave,
                start_new_session=True,
            )  # fmt: skip

        def admit(pid: int) -> None:
            if context.cgroup:
                add_to_cgroup(context.cgroup, pid)

        return start_gated(start, admit)

    def resize(self, rows: int, cols: int) -> None:
        set_size(self.master, rows, cols)

    def hangup(self) -> None:
        """SIGHUP to the session's process group, SIGKILL after HANGUP_GRACE."""
        for sig in (signal.SIGHUP, signal.SIGCONT):
            self._signal(sig)
        try:
            self.proc.wait(HANGUP_GRACE)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> int:
        """The session is over: its exit status; the terminal and the script are gone."""
        if self.proc.poll() is None:
            self.hangup()
        code = exit_status(self.proc.wait())
        os.close(self.master)
        try:
            self.script.unlink()
        except OSError:
            pass
        return code


class TerminalSession:
    """One session: the websocket to the server and the pseudo-terminal, on two threads (the
    terminal's output to the server, and the server's frames to the terminal)."""

    def __init__(self, server: str, token: str, order: TerminalOrder,
                 context: TaskContext | None, problem: str,
                 add_to_cgroup: Callable[[str, int], None]) -> None:  # fmt: skip
        self.url = websocket_url(server, order.session)
        self.origin = server.rstrip("/")
        self.token, self.order, self.context = token, order, context
        self.problem, self.add_to_cgroup = problem, add_to_cgroup
        self.done: Callable[[str], None] = lambda session_id: None
        self.credit = threading.Semaphore(TERMINAL_WINDOW)
        self.hung_up = threading.Event()
        self.pty: Pty | None = None
        self.ws: Any = None

    def start(self) -> None:
        threading.Thread(target=self.run, name=f"terminal-{self.order.session[:8]}",
                         daemon=True).start()  # fmt: skip

    def run(self) -> None:
        try:
            self._run()
        except Exception:  # noqa: BLE001 - one session never harms the agent or its tasks
            log.exception("terminal session %s failed", self.order.session[:8])
        finally:
            self.done(self.order.session)

    def _run(self) -> None:
        from websockets.sync.client import connect
        from websockets.typing import Origin

        headers = {"Authorization": f"Node {self.token}", PROTOCOL_HEADER: str(PROTOCOL)}
        with connect(self.url, additional_headers=headers, origin=Origin(self.origin),
                     proxy=None, compression=None, open_timeout=10,
                     max_size=4 * TERMINAL_FRAME_BYTES) as ws:  # fmt: skip
            self.ws = ws
            if self.context is None or self.problem:
                self._send_json({"type": "error", "message": self.problem or "no such task"})
                return
            try:
                self.pty = Pty(self.order, self.context, self.add_to_cgroup)
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                self._send_json({"type": "error", "message": f"cannot start the session: {exc}"})
                return
            log.info("terminal session %s opened in task %s", self.order.session[:8],
                     self.order.task)  # fmt: skip
            threading.Thread(target=self._from_server, daemon=True).start()
            why = self._to_server()
            status = self.pty.close()
            sent = self._send_json({"type": "exit", "status": status})
            told = "told the server" if sent else "the server's socket is gone"
            log.info("terminal session %s ended (%s): exit status %s, %s",
                     self.order.session[:8], why, status, told)  # fmt: skip

    def _send_json(self, message: dict[str, Any]) -> bool:
        try:
            self.ws.send(json.dumps(message))
        except Exception:  # noqa: BLE001 - the server went away: nothing more to tell it
            return False
        return True

    def _to_server(self) -> str:
        """The terminal's output to the server, at most TERMINAL_WINDOW frames unacknowledged,
        until the program's side closes or the session is hung up; why it stopped."""
        assert self.pty is not None
        master = self.pty.master
        while not self.hung_up.is_set():
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                if self.pty.proc.poll() is not None:
                    return "the program ended"  # nothing more to read (children keep it open)
                continue
            try:
                data = os.read(master, TERMINAL_FRAME_BYTES)
            except OSError:  # EIO: every process of the session closed the terminal
                return "the terminal closed"
            if not data:
                return "the terminal closed"
            while not self.credit.acquire(timeout=0.5):
                if self.hung_up.is_set():
                    return "hung up while waiting for the reader"
            try:
                self.ws.send(data)
            except Exception:  # noqa: BLE001 - the socket is gone: hang up
                self.hung_up.set()
                return "the server's socket is gone"
        return "hung up"

    def _from_server(self) -> None:
        assert self.pty is not None
        try:
            for frame in self.ws:
                if isinstance(frame, bytes):
                    _write_all(self.pty.master, frame)
                elif not self._control(frame):
                    break
        except Exception:  # noqa: BLE001 - the socket closed: the session ends
            pass
        self.hung_up.set()
        if self.pty.proc.poll() is None:
            self.pty.hangup()

    def _control(self, text: str) -> bool:
        """A control message from the server; False when it hangs up."""
        try:
            message = json.loads(text)
        except ValueError:
            return True
        if not isinstance(message, dict):
            return True
        kind = message.get("type")
        if kind == "resize" and self.pty is not None:
            self.pty.resize(terminal_size(message.get("rows"), self.order.rows),
                            terminal_size(message.get("cols"), self.order.cols))  # fmt: skip
        elif kind == "ack":
            n = message.get("n")
            for _ in range(n if isinstance(n, int) and 0 < n <= TERMINAL_WINDOW else 0):
                self.credit.release()
        elif kind == "hangup":
            return False
        return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def websocket_url(server: str, session: str) -> str:
    base = server.rstrip("/")
    scheme, sep, rest = base.partition("://")
    ws_scheme = "wss" if scheme == "https" else "ws"
    return f"{ws_scheme}://{rest}{TERMINAL_PATH.format(session=session)}" if sep else base


class Terminals:
    """The agent's open sessions, by id: each listed in its leases (so that the server does
    not order it again) until it ends."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: set[str] = set()

    def ids(self) -> list[str]:
        with self.lock:
            return sorted(self.live)

    def open(self, session: TerminalSession) -> None:
        with self.lock:
            if session.order.session in self.live:
                return
            self.live.add(session.order.session)
        session.done = self._ended
        session.start()

    def _ended(self, session_id: str) -> None:
        with self.lock:
            self.live.discard(session_id)
