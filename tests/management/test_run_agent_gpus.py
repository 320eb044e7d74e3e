"""`manage.py run_agent --fake-gpus` for real: its lease renewals carry each GPU's
utilisation, busy while a task holds the GPU and idle once it ended, and the server keeps them."""

from __future__ import annotations

from typing import Any

from scheduler.models import DeviceSample, Node, Task
from scheduler.states.names import TaskState
from tests.factories import make_job
from tests.management.test_run_agent import (
    LOCK,
    assign,
    manage,
    server,  # noqa: F401 - the live server fixture
    stop,
    wait_for,
)


def _busy(index: int, after: Any = None) -> list[tuple[int, int]]:
    rows = DeviceSample.objects.filter(device__index=index, device__node__name="gpu-node")
    if after is not None:
        rows = rows.filter(time__gt=after)
    return list(rows.order_by("time").values_list("utilization", "memory_used"))


def test_the_agent_reports_the_gpu_its_task_holds_as_busy(
    server: str,  # noqa: F811 - the fixture imported above
    owner: Any,
    tmp_path: Any,
    settings: Any,
) -> None:
    settings.BERTH_GPU_SAMPLE_SECONDS = 0.2  # the fixture renews leases every 0.1 s
    agent = manage(tmp_path, "run_agent", "--server", server, "--name", "gpu-node",
                   "--fake-gpus", "2", "--work-dir", str(tmp_path / "agent"))  # fmt: skip
    try:
        node = wait_for(lambda: Node.objects.filter(name="gpu-node").first(), what="register")
        wait_for(lambda: _busy(0) and _busy(1), what="idle samples")
        with LOCK:
            assert all(u == 0 for u, _ in _busy(1))
            job = make_job(owner, gpu=1, command="sleep 2")
            task = job.tasks.get()
            assign(task, node, [1])
        # While it runs, GPU 1 is busy and GPU 0 stays idle.
        wait_for(lambda: any(u > 0 for u, _ in _busy(1)), what="GPU 1 busy")
        with LOCK:
            assert all(u == 0 and m == 0 for u, m in _busy(0))
            assert all(m > 0 for u, m in _busy(1) if u > 0)

        def ended() -> Any:
            row = Task.objects.get(pk=task.pk)
            return row.finished_at if row.state == TaskState.SUCCEEDED else None

        finished = wait_for(ended, timeout=15, what="the task to end")
        # The first sample the server keeps after the end may have been measured before it:
        # a renewal built while the task still ran can arrive after its end was reported.
        # The agent measures each renewal's sample once the previous one was answered, so the
        # second sample kept after the end was measured after it.
        wait_for(lambda: len(_busy(1, after=finished)) >= 2, what="two samples after the end")
        with LOCK:
            assert _busy(1, after=finished)[-1] == (0, 0)
    finally:
        code = stop(agent)
    assert code == 0, (tmp_path / "command.log").read_text()
