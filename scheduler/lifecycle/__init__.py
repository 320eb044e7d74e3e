"""Job lifecycle: what the scheduler loop runs after placing jobs, one concern per module.

- transitions: moving one job through the state machine (scheduler/states/job.py), stopping it;
- requests: the cancel/suspend/resume requests users made;
- sync: job states from task states (started, succeeded, failed, lost);
- deadlines: walltime and active deadlines;
- idle_sessions: interactive jobs holding GPUs idle with no terminal input, warned then ended;
- nodes: node health, drains and deleted nodes;
- ttl: deleting finished jobs whose TTL passed.

Each public function is one unit of work that returns how much it did, so the loop and the
tests call them directly. Resources are released only when an agent confirms a task stopped
(its report of the task's end deletes the task's allocations) or when its node is lost; until
then a task that was asked to stop still holds its node's cpu, memory and devices.
"""

from scheduler.lifecycle.deadlines import LATEST, after, enforce_deadlines
from scheduler.lifecycle.nodes import check_nodes, lose_orphaned_tasks, lose_tasks_of_node
from scheduler.lifecycle.requests import process_requests
from scheduler.lifecycle.sync import JobView, TaskView, sync_jobs
from scheduler.lifecycle.transitions import USER_SUSPENDED, terminate_job
from scheduler.lifecycle.ttl import cleanup_ttl, ttl_expired_jobs
from scheduler.states.names import PREEMPTED

__all__ = [
    "LATEST",
    "PREEMPTED",
    "USER_SUSPENDED",
    "JobView",
    "TaskView",
    "after",
    "check_nodes",
    "cleanup_ttl",
    "enforce_deadlines",
    "lose_orphaned_tasks",
    "lose_tasks_of_node",
    "process_requests",
    "sync_jobs",
    "terminate_job",
    "ttl_expired_jobs",
]
