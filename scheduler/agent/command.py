"""The agent's command line, shared by `python -m scheduler.agent` and `manage.py run_agent`.

Django-free: a node needs only this package (the standard library, and nvidia-ml-py for real
GPUs). `manage.py run_agent` adds these same flags to its parser and calls `run`, turning a
`UsageError` into Django's CommandError.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scheduler.agent import devicebpf
from scheduler.agent.cleanup import DEFAULT_KEEP_WORK_DIRS
from scheduler.agent.fence import DEFAULT_PIDS_LIMIT, MODES, Fence
from scheduler.agent.gpumodes import MPS, parse_fake_mig, parse_sharing
from scheduler.agent.isolation import DEFAULT_TASK_UIDS, DEFAULT_TASK_USER, parse_uid_range
from scheduler.agent.mps import CONTROL_ENV, find_control
from scheduler.agent.runtime import Agent, parse_labels
from scheduler.agent.signals import stop_on_signals
from scheduler.core.quantity import parse_memory

log = logging.getLogger("berth.agent")
MAX_TOKEN_FILE = 4096
MAX_ALLOWED_DEVICES = 64
TASK_UIDS_TEXT = f"{DEFAULT_TASK_UIDS[0]}-{DEFAULT_TASK_UIDS[1]}"
DESCRIPTION = (
    "Run the node agent: register this machine with the server (cpu, memory, GPUs found"
    " through NVML, or --fake-gpus), then heartbeat, run the tasks the server assigns as"
    " real processes and ship their output. It talks to the server over HTTP only. The"
    " join token comes from BERTH_JOIN_TOKEN or --join-token-file; it registers new node"
    " names only, and a restarted agent re-registers with its own node token (kept 0600 in"
    " --state-dir). As root, tasks run as the submitting user's Unix account of the same"
    " name, else as --task-user, with an environment built from scratch. SIGTERM stops the"
    " agent; its tasks go on unless --kill-on-exit, and a restarted agent re-adopts them."
)


class UsageError(Exception):
    """A flag or the join token is unusable: the message names it."""


def join_token_from(path: str | None) -> str:
    """The cluster join token, from --join-token-file or BERTH_JOIN_TOKEN. Never from the
    command line: every process on the machine can read /proc/*/cmdline."""
    if path:
        try:
            with open(path, "rb") as handle:
                token = handle.read(MAX_TOKEN_FILE).decode(errors="replace").strip()
        except OSError as exc:
            raise UsageError(f"--join-token-file: cannot read {path}: {exc.strerror}") from None
        if not token:
            raise UsageError(f"--join-token-file: {path} is empty")
        if os.stat(path).st_mode & 0o077:
            log.warning("%s is readable by other users: chmod 600 it", path)
        return token
    token = os.environ.get("BERTH_JOIN_TOKEN", "").strip()
    if not token:
        raise UsageError(
            "no join token: set BERTH_JOIN_TOKEN or pass --join-token-file PATH (the token"
            " itself is never accepted on the command line, where every process can read it)"
        )
    return token


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The agent's flags (docs/agents.md), on either parser."""
    parser.add_argument("--server", required=True, help="the server's URL")
    parser.add_argument(
        "--join-token-file",
        default=None,
        metavar="PATH",
        help="read the cluster's join token from PATH (default: $BERTH_JOIN_TOKEN)",
    )
    parser.add_argument("--name", default=None, help="node name (default: the hostname)")
    parser.add_argument("--labels", default="", help="node labels, k=v,k=v")
    parser.add_argument("--fake-gpus", type=int, default=0, help="N fake GPUs if NVML finds none")
    parser.add_argument(
        "--work-dir",
        default="berth-agent",
        help="where task work dirs are made (0711; each task's own dir is 0700)",
    )
    parser.add_argument(
        "--state-dir",
        default=None,
        help="the agent's private state: node token, task output (0700; default: WORK_DIR/state)",
    )
    parser.add_argument(
        "--task-user",
        default=os.environ.get("BERTH_TASK_USER", "").strip() or DEFAULT_TASK_USER,
        help="as root with --task-uids off: the one account for tasks whose owner has no Unix"
        " account here (default: $BERTH_TASK_USER or nobody; never root)",
    )
    parser.add_argument("--kill-on-exit", action="store_true", help="kill tasks on exit")
    parser.add_argument(
        "--min-free-disk",
        default="256Mi",
        help="below this much free space in the work or state dir the node takes no new task"
        " and says why (default %(default)s)",
    )
    _add_enforcement_arguments(parser)
    _add_sharing_arguments(parser)


def _add_sharing_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that say which GPU sharing modes the node offers (docs/gpus.md)."""
    parser.add_argument(
        "--gpu-sharing",
        default="auto",
        metavar="auto|none|MODES",
        help="how tasks may share this node's GPUs: none (whole GPUs only), or some of mig,mps,"
        "timeslice separated by commas. auto (the default): the MIG instances an"
        " administrator made, and timeslice on fake GPUs; MPS and time-slicing of real GPUs"
        " only when named, since neither keeps one task's faults from the others",
    )
    parser.add_argument(
        "--mps-control",
        default=None,
        metavar="PATH",
        help=f"the nvidia-cuda-mps-control binary (default: ${CONTROL_ENV}, else the one on"
        " PATH); the agent runs one MPS control daemon per GPU it shares through MPS",
    )
    parser.add_argument(
        "--fake-mig",
        action="append",
        default=[],
        metavar="GPU:PROFILES",
        help="give fake GPU GPU (an index below --fake-gpus) MIG instances of these profiles,"
        " e.g. 0:1g.10gb,1g.10gb,2g.20gb; repeat for more GPUs (for tests: no real MIG)",
    )


def _add_enforcement_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that say how tasks are held to their requests and kept apart."""
    parser.add_argument(
        "--task-uids",
        default=os.environ.get("BERTH_TASK_UIDS", "").strip() or TASK_UIDS_TEXT,
        metavar="START-END|off",
        help="as root: users without a Unix account here each run under a uid of their own"
        " from this range (default: $BERTH_TASK_UIDS or %(default)s); off: they all run as"
        " --task-user",
    )
    parser.add_argument(
        "--enforce",
        choices=MODES,
        default=None,
        help="required (the default as root): run no task unless its memory, CPU, pids,"
        " processes and GPU devices are held by a cgroup; best-effort: run tasks with"
        " whatever this machine enforces (the default when not root)",
    )
    parser.add_argument(
        "--pids-limit",
        type=int,
        default=DEFAULT_PIDS_LIMIT,
        help=f"processes a task may have at once (default {DEFAULT_PIDS_LIMIT})",
    )
    parser.add_argument(
        "--allow-device",
        action="append",
        default=[],
        metavar="RULE",
        help="a device every task may use besides the base set (null, zero, random, ttys) and"
        " its own GPUs, in devices.allow syntax, e.g. 'c 231:* rw' for InfiniBand verbs or"
        " 'c 10:229 rw' for FUSE; repeat for more",
    )
    parser.add_argument(
        "--keep-work-dirs",
        type=float,
        default=DEFAULT_KEEP_WORK_DIRS,
        metavar="SECONDS",
        help="remove an ended task's work dir this long after its last change"
        f" (default {DEFAULT_KEEP_WORK_DIRS:.0f})",
    )


def make_agent(options: Mapping[str, Any]) -> Agent:
    """An agent from parsed flags, its directories made; UsageError names a bad flag."""
    if not options["server"].startswith(("http://", "https://")):
        raise UsageError(f"--server: expected an http(s):// URL, got {options['server']!r}")
    if options["fake_gpus"] < 0:
        raise UsageError("--fake-gpus: must be 0 or more")
    try:
        parse_labels(options["labels"])
    except ValueError as exc:
        raise UsageError(f"--labels: {exc}") from None
    try:
        min_free = parse_memory(options.get("min_free_disk") or "256Mi")
    except ValueError as exc:
        raise UsageError(f"--min-free-disk: {exc}") from None
    if options.get("pids_limit", DEFAULT_PIDS_LIMIT) < 1:
        raise UsageError("--pids-limit: must be 1 or more")
    if not 0 <= options.get("keep_work_dirs", DEFAULT_KEEP_WORK_DIRS) < 10**9:
        raise UsageError("--keep-work-dirs: must be 0 or more seconds")
    try:
        task_uids = parse_uid_range(options.get("task_uids") or "off")
    except ValueError as exc:
        raise UsageError(f"--task-uids: {exc}") from None
    sharing = sharing_options(options)
    join_token = join_token_from(options["join_token_file"])
    agent = Agent(
        server=options["server"],
        join_token=join_token,
        name=options["name"],
        labels=options["labels"],
        fake_gpus=options["fake_gpus"],
        work_dir=Path(options["work_dir"]),
        state_dir=options["state_dir"],
        kill_on_exit=options["kill_on_exit"],
        task_user=options["task_user"],
        min_free_disk=min_free,
        task_uids=task_uids,
        keep_work_dirs=options.get("keep_work_dirs", DEFAULT_KEEP_WORK_DIRS),
        **sharing,
    )
    agent.fence = Fence(
        options.get("enforce"),
        base_name=f"berth-{agent.name}",
        pids_limit=options.get("pids_limit", DEFAULT_PIDS_LIMIT),
        allow=allowed_devices(options.get("allow_device") or []),
    )
    try:
        agent.prepare()
    except (ValueError, OSError) as exc:
        raise UsageError(f"--task-user/--work-dir/--state-dir: {exc}") from None
    return agent


def sharing_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's `gpu_sharing` (--gpu-sharing; None: auto) and `mps_control` (the control
    binary); UsageError when MPS is asked for and there is no control binary to run."""
    try:
        sharing = parse_sharing(options.get("gpu_sharing") or "auto")
    except ValueError as exc:
        raise UsageError(f"--gpu-sharing: {exc}") from None
    try:
        fake_mig = parse_fake_mig(options.get("fake_mig") or [], options.get("fake_gpus") or 0)
    except ValueError as exc:
        raise UsageError(f"--fake-mig: {exc}") from None
    control = find_control(options.get("mps_control"))
    if options.get("mps_control") and control is None:
        raise UsageError(f"--mps-control: {options['mps_control']} is not an executable file")
    if sharing and MPS in sharing and control is None:
        raise UsageError(
            "--gpu-sharing mps: no nvidia-cuda-mps-control on PATH (install the CUDA"
            f" toolkit's MPS tools, or name it with --mps-control or ${CONTROL_ENV})"
        )
    return {"gpu_sharing": sharing, "mps_control": control, "fake_mig": fake_mig}


def allowed_devices(rules: list[str]) -> tuple[str, ...]:
    """--allow-device rules, each checked as the kernel would read it (UsageError)."""
    if len(rules) > MAX_ALLOWED_DEVICES:
        raise UsageError(f"--allow-device: at most {MAX_ALLOWED_DEVICES} rules")
    for rule in rules:
        try:
            parsed = devicebpf.parse(rule)
        except ValueError as exc:
            raise UsageError(f"--allow-device: {exc}") from None
        if parsed.kind == "a" or (parsed.major is None and parsed.access & 6):
            raise UsageError(f"--allow-device: {rule!r} would open every device of its kind")
    return tuple(" ".join(rule.split()) for rule in rules)


def run(options: Mapping[str, Any]) -> None:
    """Run the agent until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    agent = make_agent(options)
    agent.run(stop_on_signals())


def parser(prog: str = "python -m scheduler.agent") -> argparse.ArgumentParser:
    # No abbreviations: the removed --join-token must not silently mean --join-token-file.
    result = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, allow_abbrev=False)
    add_arguments(result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m scheduler.agent`: exit 0 when stopped, 2 on a bad flag or token."""
    args = parser()
    options = vars(args.parse_args(argv))
    try:
        run(options)
    except UsageError as exc:
        args.error(str(exc))  # prints the usage and exits 2
    return 0
