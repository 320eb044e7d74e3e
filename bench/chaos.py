"""Chaos suite: each fault under a steady load, in Berth's production layout, with the steady
state checked before and after (the Chaos Mesh habit: one experiment per fault).

    python bench/chaos.py                                  # every fault this machine can make
    python bench/chaos.py --faults pg-restart,pg-down --outage 60 --rate 6 --clients 4

For each fault it starts a fresh private PostgreSQL and Redis and `./run serve`, two
`run_scheduler` (leader and standby) and simulated nodes on them (bench/faults.py), lets the
load run, makes the fault, ends it, and prints one JSON object per fault:

- `bad_5xx`: answers 5xx other than a deliberate 503 with Retry-After (must be 0);
- `answered_503`: deliberate refusals (the clients waited and sent again);
- `lost`: jobs answered 201 that did not end Succeeded (must be 0);
- `written_despite_503`: submissions answered 503 that were written anyway (must be 0);
- `doubled`: usage records twice for one attempt, attempts of one task that overlapped in
  time, and (real agents) a task found running on two nodes at once (must be 0);
- `healthz_back_s`: from the fault's end until /healthz answers 200;
- `drained_s`: from the fault's end until every accepted job is final;
- `alive`: every Berth process still running at the end.

Faults: pg-restart (PostgreSQL stopped and started: `--restart-seconds`), pg-down
(unreachable for `--outage`), redis-down (Redis killed for `--outage`), leader-freeze (the
leading scheduler SIGSTOPped for `--outage`, then resumed), partition (a real agent in its own
network namespace cut off for `--outage`; root), node-disk-full (a real agent's disk filled;
root), db-disk-full (the database's volume filled; root), clock-skew (a real agent whose clock
is an hour ahead). Root-only faults are listed as skipped elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.faults import (  # noqa: E402
    Load,
    Netns,
    PrivatePostgres,
    PrivateRedis,
    Stack,
    check,
    cluster,
    fill,
    freeze,
    small_disk,
    thaw,
    wait_drained,
)

ROOT_ONLY = {"partition", "node-disk-full", "db-disk-full"}
FAULTS = ["pg-restart", "pg-down", "redis-down", "leader-freeze", "partition",
          "node-disk-full", "db-disk-full", "clock-skew"]  # fmt: skip


def say(what: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def _until(check_: Callable[[], Any], timeout: float) -> float | None:
    """Seconds until `check_()` is truthy; None if it never was within `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if check_():
                return round(time.monotonic() - started, 2)
        except Exception:  # noqa: BLE001 - not yet
            pass
        time.sleep(0.2)
    return None


# --- faults: each makes the fault, ends it, and returns what it saw meanwhile ---------------


def pg_restart(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    stack.pg.stop()
    time.sleep(args.restart_seconds)
    stack.pg.start()
    return {}


def pg_down(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    return _outage(stack, stack.pg, args.outage)


def redis_down(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    return _outage(stack, stack.redis, args.outage)


def _outage(
    stack: Stack, service: PrivatePostgres | PrivateRedis, seconds: float
) -> dict[str, Any]:
    """`service` stopped for `seconds`; what /healthz said halfway through."""
    service.stop()
    time.sleep(seconds / 2)
    seen = {"healthz_while_down": _healthz(stack)}
    time.sleep(seconds / 2)
    service.start()
    return seen


def leader_freeze(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    frozen = _until(stack.leader, 30) is not None and stack.leader()
    if not frozen:
        raise RuntimeError("no scheduler leads")
    freeze(stack.procs[frozen])
    try:
        took_over = _until(lambda: stack.leader() not in (None, frozen), max(args.outage, 10))
        time.sleep(max(0.0, args.outage - (took_over or 0)))
    finally:
        thaw(stack.procs[frozen])
    # The old leader wakes up believing it leads: it must notice and stand by.
    stood_down = _until(lambda: "lost the leader lock" in stack.log(frozen)
                        or "stepping down" in stack.log(frozen), 30)  # fmt: skip
    return {"frozen": frozen, "standby_took_over_s": took_over,
            "woken_leader_stood_down_s": stood_down}  # fmt: skip


def _healthz(stack: Stack) -> Any:
    import httpx

    try:
        response = httpx.get(f"{stack.url}/healthz", timeout=3)
        return {"status": response.status_code, **response.json()}
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": repr(exc)}


# --- real agents ---------------------------------------------------------------------------


def agent_command(stack: Stack, name: str, work: Path, server: str | None = None,
                  extra: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
    return [sys.executable, "-m", "scheduler.agent", "--server", server or stack.url,
            "--name", name, "--labels", "chaos=real", "--work-dir", str(work / name),
            "--state-dir", str(work / f"{name}-state"), "--kill-on-exit", *extra]  # fmt: skip


def agent_env(stack: Stack) -> dict[str, str]:
    env = stack.env()
    env.pop("DATABASE_URL")  # an agent needs no database (and could not reach it there)
    return env


def guarded_job(marks: Path, seconds: int) -> dict[str, Any]:
    """A job whose task holds a lock file while it runs: an attempt that finds the lock held
    by another attempt of the same job records itself in `marks/doubles`."""
    lock = f"{marks}/$BERTH_JOB_ID.lock"
    command = (f"flock -n {lock} sleep {seconds} || {{ echo $BERTH_JOB_ID >> {marks}/doubles;"
               " exit 1; }")  # fmt: skip
    return {"name": "guarded", "max_retry": 3,
            "tasks": [{"name": "main", "command": command,
                       "resources": {"cpu": "0.1", "memory": "64Mi"},
                       "node_selector": {"chaos": "real"}}]}  # fmt: skip


def _marks() -> Path:
    # Not under /tmp: as root, each task gets a private /tmp of its own, where two attempts
    # would never see each other's lock.
    marks = Path(tempfile.mkdtemp(prefix="berth-chaos-marks-", dir="/var/tmp"))
    marks.chmod(0o1777)  # tasks run as an unprivileged account
    return marks


def doubles(marks: Path) -> int:
    path = marks / "doubles"
    return len(path.read_text().split()) if path.exists() else 0


def submit(stack: Stack, token: str, body: dict[str, Any]) -> int:
    import httpx

    answer = httpx.post(f"{stack.url}/api/v1/jobs/", json=body, timeout=30,
                        headers={"Authorization": f"Token {token}"})  # fmt: skip
    if answer.status_code != 201:
        raise RuntimeError(f"submitting {body['name']}: {answer.status_code} {answer.text[:300]}")
    return int(answer.json()["id"])


def job_row(stack: Stack, job: int) -> tuple[str, str, int]:
    """A job's state, the node of its current attempt and that attempt's number."""
    rows = stack.pg.sql(
        stack.database,
        "SELECT j.state, coalesce(n.name, ''), t.attempt FROM scheduler_job j"
        " JOIN scheduler_task t ON t.job_id = j.id LEFT JOIN scheduler_node n ON n.id = t.node_id"
        " WHERE j.id = %s",
        job,
    )
    return (str(rows[0][0]), str(rows[0][1]), int(rows[0][2])) if rows else ("", "", 0)


def partition(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """A real agent in its own namespace runs a guarded job; its link is cut; the server
    gives its node up and retries the job on a second agent; the first must have stopped it
    by then. The link comes back and the first agent rejoins."""
    marks, token = _marks(), stack.user_token
    with Netns() as ns:
        server = f"http://{ns.outer}:{stack.port}"
        stack.start("agent-cut", ns.command(agent_command(stack, "cut", work, server)),
                    env=agent_env(stack))  # fmt: skip
        _until(lambda: job_row_ready(stack, "cut"), 30)
        job = submit(stack, token, guarded_job(marks, args.job_seconds))
        if _until(lambda: job_row(stack, job)[:2] == ("Running", "cut"), 60) is None:
            raise RuntimeError(
                f"the guarded job did not start on the cut agent: {job_row(stack, job)}"
            )
        stack.start("agent-other", agent_command(stack, "other", work), env=agent_env(stack))
        ns.cut()
        moved = _until(lambda: job_row(stack, job)[1] == "other", args.outage + 30)
        time.sleep(max(0.0, args.outage - (moved or 0)))
        ns.restore()
        rejoined = _until(lambda: job_row_ready(stack, "cut"), 60)
        finished = _until(lambda: job_row(stack, job)[0] in ("Succeeded", "Failed"),
                          args.job_seconds + 60)  # fmt: skip
        stack.procs.pop("agent-cut").terminate()
    result = {"guarded_job": job_row(stack, job)[0], "moved_after_s": moved,
              "cut_agent_rejoined_s": rejoined, "guarded_finished_s": finished,
              "ran_twice_at_once": doubles(marks),
              "cut_agent_fenced": "cut off from the server" in stack.log("agent-cut")}  # fmt: skip
    shutil.rmtree(marks, ignore_errors=True)
    return result


def job_row_ready(stack: Stack, node: str) -> bool:
    rows = stack.pg.sql(stack.database, "SELECT state FROM scheduler_node WHERE name = %s", node)
    return bool(rows) and rows[0][0] == "Ready"


def node_state(stack: Stack, node: str) -> tuple[str, str]:
    rows = stack.pg.sql(
        stack.database,
        "SELECT state, coalesce(usage->>'pressure', '') FROM scheduler_node WHERE name = %s",
        node,
    )
    return (str(rows[0][0]), str(rows[0][1])) if rows else ("", "")


def node_disk_full(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """A real agent whose disk fills: its node says why and takes no task; jobs run
    elsewhere; once freed, it takes tasks again."""
    token = stack.user_token
    with small_disk(64) as disk:
        command = agent_command(stack, "full", disk, extra=("--min-free-disk", "8Mi"))
        stack.start("agent-full", command, env=agent_env(stack))
        _until(lambda: job_row_ready(stack, "full"), 30)
        filler = fill(disk, leave=1 << 20)
        pressured = _until(lambda: node_state(stack, "full")[1] != "", 30)
        said = node_state(stack, "full")[1]
        stack.start("agent-roomy", agent_command(stack, "roomy", work), env=agent_env(stack))
        job = submit(stack, token, {"name": "elsewhere", "tasks": [
            {"name": "main", "command": "true", "resources": {"cpu": "0.1", "memory": "64Mi"},
             "node_selector": {"chaos": "real"}}]})  # fmt: skip
        ran = _until(lambda: job_row(stack, job)[0] == "Succeeded", 60)
        where = job_row(stack, job)[1]
        filler.unlink()
        relieved = _until(lambda: node_state(stack, "full")[1] == "", 30)
        stack.procs.pop("agent-full").terminate()
    return {"pressure_reported_s": pressured, "pressure": said, "job_ran_on": where,
            "job_succeeded_s": ran, "pressure_cleared_s": relieved,
            "agent_survived": "Traceback" not in stack.log("agent-full")}  # fmt: skip


def db_disk_full(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    assert stack.tablespace is not None
    filler = fill(stack.tablespace)
    time.sleep(args.outage / 2)
    seen = {"healthz_while_full": _healthz(stack), "submit_while_full": _try_submit(stack)}
    time.sleep(args.outage / 2)
    filler.unlink()
    return seen


def _try_submit(stack: Stack) -> dict[str, Any]:
    import httpx

    answer = httpx.post(f"{stack.url}/api/v1/jobs/", timeout=30,
                        headers={"Authorization": f"Token {stack.user_token}"},
                        json={"name": "probe", "tasks": [{"name": "m", "command": "true",
                              "resources": {"cpu": "0.1", "memory": "64Mi"}}]})  # fmt: skip
    return {"status": answer.status_code, "retry_after": answer.headers.get("Retry-After"),
            "detail": answer.json().get("detail")}  # fmt: skip


SKEW_SHIM = (
    "import runpy, sys, time; _t = time.time; time.time = lambda: _t() + 3600;"
    " sys.argv[0] = 'berth-agent'; runpy.run_module('scheduler.agent', run_name='__main__')"
)


def clock_skew(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """A real agent whose clock runs an hour ahead: its jobs still run and are accounted once,
    with the server's own times where the agent's are absurd."""
    token = stack.user_token
    command = agent_command(stack, "skewed", work)
    stack.start("agent-skewed", [sys.executable, "-c", SKEW_SHIM, *command[3:]],
                env=agent_env(stack))  # fmt: skip
    _until(lambda: job_row_ready(stack, "skewed"), 30)
    jobs = [submit(stack, token, {"name": "skewed", "tasks": [
        {"name": "main", "command": "sleep 1", "resources": {"cpu": "0.1", "memory": "64Mi"},
         "node_selector": {"chaos": "real"}}]}) for _ in range(3)]  # fmt: skip
    done = _until(lambda: all(job_row(stack, j)[0] == "Succeeded" for j in jobs), 60)
    wall = stack.pg.sql(stack.database, "SELECT max(wall_seconds), min(wall_seconds) FROM"
                        " scheduler_usagerecord WHERE job_id = ANY(%s)", jobs)[0]  # fmt: skip
    return {"skewed_jobs_succeeded_s": done,
            "wall_seconds_max": wall[0], "wall_seconds_min": wall[1]}  # fmt: skip


RUN: dict[str, Callable[[Stack, argparse.Namespace, Path], dict[str, Any]]] = {
    "pg-restart": pg_restart, "pg-down": pg_down, "redis-down": redis_down,
    "leader-freeze": leader_freeze, "partition": partition, "node-disk-full": node_disk_full,
    "db-disk-full": db_disk_full, "clock-skew": clock_skew,
}  # fmt: skip


def run_fault(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One experiment: steady state, the fault under load, recovery, the checks."""
    work.mkdir(parents=True, exist_ok=True)
    if name == "db-disk-full":
        with small_disk(args.db_disk_mb) as disk:
            return _experiment(name, args, work, tablespace=disk)
    return _experiment(name, args, work)


def _experiment(name: str, args: argparse.Namespace, work: Path,
                tablespace: Path | None = None) -> dict[str, Any]:  # fmt: skip
    host = "0.0.0.0" if name == "partition" else "127.0.0.1"  # the namespace reaches us there
    with cluster(work / name, nodes=args.nodes, host=host, tablespace=tablespace) as stack:
        load = Load(stack.url, stack.user_token, clients=args.clients, rate=args.rate)
        load.start()
        time.sleep(args.warmup)
        steady = stack.healthy()
        say(f"{name}: fault on")
        seen = RUN[name](stack, args, work / name)
        say(f"{name}: fault off")
        healthz_back = _until(stack.healthy, 120)
        time.sleep(args.settle)
        load.stop()
        drained = _until(lambda: wait_drained(stack, load, 1) is not None, 180)
        outcome = check(stack, load)
        alive = {n: stack.alive(n) for n in stack.procs if not n.startswith("agent-")}
        return {
            "fault": name, "steady_before": steady, **outcome.as_dict(),
            "bad_5xx": load.bad_5xx, "answered_503": load.statuses.get("503", 0),
            "answers": dict(load.statuses), "client_errors": load.errors[:5],
            "healthz_back_s": healthz_back, "drained_s": drained,
            "alive": all(alive.values()), "processes": alive, **seen,
            "doubled": outcome.doubled_usage + outcome.overlapping_attempts
            + int(seen.get("ran_twice_at_once", 0)),
        }  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, in order")
    parser.add_argument("--outage", type=float, default=60.0, help="seconds a fault lasts")
    parser.add_argument("--restart-seconds", type=float, default=3.0,
                        help="pg-restart: seconds PostgreSQL stays stopped")  # fmt: skip
    parser.add_argument("--rate", type=float, default=6.0, help="submissions per second")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes")
    parser.add_argument("--warmup", type=float, default=5.0, help="load before the fault")
    parser.add_argument("--settle", type=float, default=5.0, help="load after the fault")
    parser.add_argument("--job-seconds", type=int, default=20, help="partition: the guarded job")
    parser.add_argument("--db-disk-mb", type=int, default=48, help="db-disk-full: its volume")
    parser.add_argument("--work", type=Path, default=None, help="logs here (default: a temp dir)")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="berth-chaos-"))
    say(f"logs in {work}")
    for name in args.faults.split(","):
        if name in ROOT_ONLY and os.geteuid() != 0:
            print(json.dumps({"fault": name, "skipped": "needs root"}), flush=True)
            continue
        print(json.dumps(run_fault(name, args, work), default=str), flush=True)


if __name__ == "__main__":
    main()
