"""AccaSim's EASY backfilling on the same trace and cluster as `bench/replay.py`, for a side
by side time. Run with AccaSim's own interpreter (AccaSim lives in its own venv, not Berth's):

    /tmp/accasim/bin/python bench/accasim_easy.py TRACE.swf --nodes 100

`bench/replay.py --accasim-python /tmp/accasim/bin/python` writes the SWF and calls this.
Prints one JSON object: the simulation's wall and CPU time, jobs started and their mean wait.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("swf", type=Path)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--cores-per-node", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        simulator = _simulator(args.swf, args.nodes, args.cores_per_node, Path(work))
        started, cpu_started = time.perf_counter(), time.process_time()
        simulator.start_simulation()
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        waits = _waits(Path(work))
    print(
        json.dumps(
            {
                "simulator": "AccaSim EASYBackfilling(FirstFit)",
                "wall_seconds": round(wall, 2),
                "cpu_seconds": round(cpu, 2),
                "jobs": len(waits),
                "mean_wait_s": round(sum(waits) / len(waits), 1) if waits else None,
            }
        )
    )


def _simulator(swf: Path, nodes: int, cores: int, work: Path) -> Any:
    # AccaSim 1.1.3 imports `collections.Mapping`, which Python 3.10 removed; give it the
    # same class under the old name rather than patch AccaSim.
    import collections
    import collections.abc

    collections.Mapping = collections.abc.Mapping  # type: ignore[attr-defined]
    try:
        from accasim.base.allocator_class import FirstFit
        from accasim.base.scheduler_class import EASYBackfilling
        from accasim.base.simulator_class import Simulator
    except ImportError as exc:
        sys.exit(f"AccaSim is not importable from {sys.executable}: {exc}")
    config = work / "system.config"
    # Nodes of `cores` cores, as bench/replay.py models the log's machine (the SP2: one
    # single-core node per processor; Blue Horizon: 8-way nodes).
    config.write_text(
        json.dumps(
            {
                "groups": {"sp2": {"core": cores, "mem": 1 << 30}},
                "resources": {"sp2": nodes},
                "equivalence": {"processor": {"core": 1}},
                "start_time": 0,
            }
        )
    )
    return Simulator(
        str(swf),
        str(config),
        EASYBackfilling(FirstFit()),
        RESULTS_FOLDER_PATH=str(work),
        SCHEDULE_OUTPUT={
            "format": "{job_id};{queue_time};{start_time}",
            "attributes": {
                "job_id": ("id", "str"),
                "queue_time": ("queued_time", "int"),
                "start_time": ("start_time", "int"),
            },
        },
        scheduling_output=True,
        statistics_output=False,
        show_statistics=False,
    )


def _waits(results: Path) -> list[float]:
    """Waits from AccaSim's scheduling output: `job;queued;start` per started job."""
    waits: list[float] = []
    for path in results.glob("sched*"):
        for line in path.read_text().splitlines():
            fields = line.split(";")
            if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                waits.append(float(fields[2]) - float(fields[1]))
    return waits


if __name__ == "__main__":
    main()
