"""What the core is fed: a snapshot of nodes, devices, queues and jobs with their tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.core.predict import CORRECTIONS
from scheduler.core.priority import PriorityWeights
from scheduler.core.resources import Resources

ACTIONS = ("enqueue", "allocate", "preempt", "reclaim", "backfill")
GPU_PLACEMENTS = ("fgd", "best-fit", "first-fit")


@dataclass(frozen=True, slots=True)
class MigInfo:
    """One MIG instance of a GPU, as its agent found it: profile ("1g.10gb") and UUID."""

    profile: str
    uuid: str
    memory: int = 0  # bytes


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    index: int
    uuid: str = ""
    model: str = ""
    healthy: bool = True
    memory: int = 0  # bytes; 0: not known (no fraction asking for GPU memory goes there)
    # Its MIG instances (empty: not in MIG mode). A GPU in MIG mode is never given whole or
    # shared any other way: only its instances are, each to one task asking for its profile.
    mig: tuple[MigInfo, ...] = ()


@dataclass(slots=True)
class NodeInfo:
    name: str
    allocatable: Resources
    labels: dict[str, str] = field(default_factory=dict)
    state: str = "Ready"  # Ready | NotReady | Cordoned | Draining | Drained; only Ready takes tasks
    devices: list[DeviceInfo] = field(default_factory=list)
    # The GPU sharing modes the node offers ("mig", "mps", "timeslice"): fractions of a GPU
    # go only to a node offering one that the job's queue allows.
    sharing: tuple[str, ...] = ()


@dataclass(slots=True)
class QueueInfo:
    name: str
    weight: float = 1.0
    capability: Resources | None = None
    reclaimable: bool = True
    priority: int = 0
    open: bool = True
    # Per-user running limits in this queue (None: unlimited): GPUs, cpu in millicores, jobs
    # (Slurm's MaxTRESPerUser, MaxJobsPerUser); owners in `limits_exempt` have none.
    max_user_gpus: int | None = None
    max_user_cpus: int | None = None
    max_user_jobs: int | None = None
    limits_exempt: frozenset[str] = frozenset()

    @property
    def user_limited(self) -> bool:
        return not (self.max_user_gpus is None and self.max_user_cpus is None
                    and self.max_user_jobs is None)  # fmt: skip


@dataclass(slots=True)
class TaskInfo:
    id: int
    group: str
    index: int
    resources: Resources
    node_selector: dict[str, str] = field(default_factory=dict)
    # Pending | Assigned | Running | Releasing (asked to stop, holds resources until confirmed)
    state: str = "Pending"
    node: str | None = None
    devices: tuple[int, ...] = ()
    started_at: float | None = None
    # A fraction of one GPU (scheduler/core/sharing.py): thousandths of a device (0: none;
    # `resources.gpu` is then 1, the one device it goes on, never shared with a whole-GPU
    # task) and the GPU memory it asks for (bytes, 0: unsaid).
    gpu_share: int = 0
    gpu_memory: int = 0
    # The sharing modes the fraction may use (its queue's; empty: any the node offers).
    gpu_modes: tuple[str, ...] = ()
    # A MIG instance (scheduler/core/sharing.py): the profile asked for ("1g.10gb"; `gpu_share`
    # is then what the instance counts as, `resources.gpu` 0: it is no whole device), and for
    # a placed task the UUID of the instance it holds on its one device.
    gpu_mig: str = ""
    gpu_instance: str = ""


@dataclass(slots=True)
class JobInfo:
    id: int
    name: str
    queue: str
    owner: str
    priority: int
    preemptible: bool
    min_available: int
    created_at: float
    walltime: float | None
    state: str  # Pending | Suspended (candidates) | Running (holds its placed tasks)
    tasks: list[TaskInfo]
    suspend_requested: bool = False
    # The core's runtime prediction (scheduler/core/predict.py), planned in place of the
    # walltime when set; None: the walltime. Never a kill time.
    predicted: float | None = None

    @property
    def is_candidate(self) -> bool:
        return self.state in ("Pending", "Suspended") and not self.suspend_requested


@dataclass(slots=True)
class Snapshot:
    now: float
    nodes: list[NodeInfo]
    queues: list[QueueInfo]
    jobs: list[JobInfo]
    # Fair share: each owner's decayed, resource-weighted usage and their share (an owner
    # without one has the default share, 1). Read only when the fair-share weight is set.
    usage: dict[str, float] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SchedulingPolicy:
    """How the core schedules: which actions run and how. `strict_order`: allocate stops at
    the first job that is blocked by resources (later jobs may only start through backfill,
    if it runs)."""

    actions: tuple[str, ...] = ACTIONS
    node_order: str = "binpack"  # binpack | spread
    strict_order: bool = True
    fair_share: bool = True
    extra_plugins: tuple[Any, ...] = ()
    disabled_plugins: tuple[str, ...] = ()  # plugin names, e.g. ("drf",)
    # How a runtime prediction a running job outlived is raised (jobs with `predicted` only):
    # walltime | stepwise (scheduler/core/predict.py).
    prediction_correction: str = "walltime"
    # The job order's factors (scheduler.core.priority); all 0 by default ("factors off").
    priority_weights: PriorityWeights = PriorityWeights()
    # Where fractions of a GPU go (scheduler/core/sharing.py): fgd | best-fit | first-fit.
    gpu_placement: str = "fgd"

    def __post_init__(self) -> None:
        unknown = [a for a in self.actions if a not in ACTIONS]
        if unknown:
            raise ValueError(f"unknown actions: {', '.join(unknown)}")
        if self.node_order not in ("binpack", "spread"):
            raise ValueError(f"node_order must be binpack or spread, got {self.node_order!r}")
        if self.gpu_placement not in GPU_PLACEMENTS:
            raise ValueError(
                f"gpu_placement must be {', '.join(GPU_PLACEMENTS)}, got {self.gpu_placement!r}"
            )
        if self.prediction_correction not in CORRECTIONS:
            raise ValueError(
                f"prediction_correction must be {' or '.join(CORRECTIONS)},"
                f" got {self.prediction_correction!r}"
            )

    @classmethod
    def fcfs(cls) -> SchedulingPolicy:
        """First come, first served: strict order, no backfill, no preemption."""
        return cls(actions=("enqueue", "allocate"))

    @classmethod
    def easy(cls) -> SchedulingPolicy:
        """EASY backfill: strict order plus one reservation, no preemption."""
        return cls(actions=("enqueue", "allocate", "backfill"))
