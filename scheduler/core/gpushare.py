"""Packing fractional GPUs: the placement model of issue #23, measured on Alibaba's trace.

A node has CPU, memory and devices; each device has a free share in milli-GPUs (1000 = a whole
GPU), as the trace's `gpu_milli`. A task asks for CPU and memory and one of:

- nothing on a GPU (`num_gpu` 0);
- a fraction of one device (`num_gpu` 1, `gpu_milli` < 1000): it never spans devices;
- whole devices (`num_gpu` n, `gpu_milli` 1000): only fully free devices, never shared;

optionally restricted to some GPU models (`gpu_models`, the trace's `gpu_spec`).

A placement policy scores every node a task fits on; the highest score wins, ties going to
the first node in the cluster's order (or at random). The policies are those the FGD paper
compares (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC '23), scored as its authors' simulator scores
them, plus first fit.

Fragmentation Gradient Descent (the paper's §3-4), in four steps:

1. The target workload is the popularity-weighted set of task shapes (CPU, GPU count, GPU
   share, GPU models) that make up 95 % of the tasks: `typical_tasks`.
2. For one shape on one node, the fragment is the node's free GPU share that shape cannot use:
   all of it if the shape cannot run there at all (too little CPU, wrong model, too few devices
   with room, or no GPU asked for), else the free share on devices too full for it
   (`task_fragment`).
3. A node's fragmentation is the expectation of that over the workload (`node_fragmentation`);
   the cluster's is the sum over nodes.
4. A task goes to the node and device whose placement grows the cluster's fragmentation least,
   i.e. the node's (`FGD`), the only node whose fragmentation changes; scored, as the authors'
   simulator scores it, in whole points, the first device and (`Cluster`) the first node
   winning among equals.

Nothing here imports Django; `bench/gpushare.py` replays the trace through `Cluster`, and the
scheduler's cycle scores nodes and devices for fractions with the same policies (`sharing.py`).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MILLI = 1000  # one whole GPU
MAX_SPEC_CPU = 128_000  # the simulator's normalising bounds: a node of 128 cores ...
MAX_SPEC_GPU = 8 * MILLI  # ... and 8 GPUs
MAX_SCORE = 100
COVERAGE = 0.95  # typical shapes: the most popular ones that make up 95 % of the tasks

Devices = tuple[int, ...]
Shape = tuple[int, int, int, frozenset[str]]  # cpu_milli, num_gpu, gpu_milli, gpu_models


@dataclass(frozen=True, slots=True)
class GpuTask:
    """What one task asks for. `gpu_milli` is per device; a fraction is only ever of one."""

    cpu_milli: int
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.num_gpu < 0:
            raise ValueError("cpu_milli, memory_mib and num_gpu must not be negative")
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise ValueError("gpu_milli needs num_gpu >= 1")
        if self.num_gpu > 0 and not 0 < self.gpu_milli <= MILLI:
            raise ValueError(f"gpu_milli must be in 1..{MILLI} when num_gpu >= 1")
        if self.num_gpu > 1 and self.gpu_milli != MILLI:
            raise ValueError("a fraction never spans devices: num_gpu > 1 needs whole GPUs")

    @property
    def gpu_total(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def fraction(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    @property
    def shape(self) -> Shape:
        """What fragmentation looks at (memory is not part of it, as in the paper)."""
        return (self.cpu_milli, self.num_gpu, self.gpu_milli, self.gpu_models)

    @property
    def tag(self) -> str:
        """GPU clustering's affinity: share, n whole GPUs, or none."""
        if self.num_gpu == 0:
            return "none"
        return "share" if self.fraction else f"{self.num_gpu}-gpu"


@dataclass(slots=True)
class GpuNode:
    """A node's capacity and what is free on it, device by device."""

    name: str
    model: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    cpu_free: int = field(init=False)
    mem_free: int = field(init=False)
    gpu_free: list[int] = field(init=False)
    tags: Counter[str] = field(init=False)  # GPU tasks placed here, by `GpuTask.tag`

    def __post_init__(self) -> None:
        self.cpu_free = self.cpu_milli
        self.mem_free = self.memory_mib
        self.gpu_free = [MILLI] * self.gpus
        self.tags = Counter()

    @property
    def gpu_free_total(self) -> int:
        return sum(self.gpu_free)

    def place(self, task: GpuTask, devices: Devices) -> None:
        """Take `task`'s request on `devices`; refuse anything that would over-allocate."""
        if devices not in device_options(self.gpu_free, task):
            raise ValueError(f"{self.name}: devices {devices} cannot take {task}")
        if task.cpu_milli > self.cpu_free or task.memory_mib > self.mem_free:
            raise ValueError(f"{self.name}: not enough CPU or memory for {task}")
        if task.num_gpu and task.gpu_models and self.model not in task.gpu_models:
            raise ValueError(f"{self.name}: model {self.model} not in {sorted(task.gpu_models)}")
        self.cpu_free -= task.cpu_milli
        self.mem_free -= task.memory_mib
        for device in devices:
            self.gpu_free[device] -= task.gpu_milli
        if task.num_gpu:
            self.tags[task.tag] += 1


def device_options(gpu_free: Sequence[int], task: GpuTask) -> list[Devices]:
    """Every way `task` can take devices with these free shares ([] if none).

    A fraction may go on any one device with room; whole GPUs take the first fully free
    devices (which ones does not change what is left), so they never share a device."""
    if task.num_gpu == 0:
        return [()]
    if task.fraction:
        return [(i,) for i, free in enumerate(gpu_free) if free >= task.gpu_milli]
    whole = [i for i, free in enumerate(gpu_free) if free == MILLI]
    return [tuple(whole[: task.num_gpu])] if len(whole) >= task.num_gpu else []


def fits(node: GpuNode, task: GpuTask) -> list[Devices]:
    """`device_options` on `node`, or [] when its CPU, memory or GPU model rule it out."""
    if task.cpu_milli > node.cpu_free or task.memory_mib > node.mem_free:
        return []
    if task.num_gpu and task.gpu_models and node.model not in task.gpu_models:
        return []
    return device_options(node.gpu_free, task)


def best_fit_device(gpu_free: Sequence[int], options: list[Devices]) -> Devices:
    """The device with the least room that still fits (lowest index on ties)."""
    return min(options, key=lambda devices: gpu_free[devices[0]] if devices else 0)


# --- fragmentation -------------------------------------------------------------------------

TypicalTasks = tuple[tuple[GpuTask, float], ...]


def typical_tasks(tasks: Iterable[GpuTask], coverage: float = COVERAGE) -> TypicalTasks:
    """The workload's most popular shapes, each with its share, covering `coverage` of tasks.

    Shapes are counted by `GpuTask.shape`; the most popular are taken (larger shapes first
    among equals) until they make up `coverage` of all tasks, and their shares renormalised."""
    counts = Counter(task.shape for task in tasks)
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0][:3]), reverse=True)
    chosen: list[tuple[Shape, int]] = []
    covered = 0
    for shape, count in ranked:
        if covered >= coverage * total:
            break
        chosen.append((shape, count))
        covered += count
    return tuple(
        (GpuTask(cpu, 0, num, milli, models), count / covered)
        for (cpu, num, milli, models), count in chosen
    )


def task_fragment(model: str, cpu_free: int, gpu_free: Sequence[int], task: GpuTask) -> int:
    """The free GPU share (milli) on a node that `task` cannot use.

    All of it when the task cannot run there at all: it asks for no GPU, or for a model the
    node lacks, or for more CPU than is free, or for more devices than have room. Otherwise
    the share left on devices too full for it."""
    total = sum(gpu_free)
    if task.num_gpu == 0 or cpu_free < task.cpu_milli:
        return total
    if task.gpu_models and model not in task.gpu_models:
        return total
    room = [free for free in gpu_free if free >= task.gpu_milli]
    if len(room) < task.num_gpu:
        return total
    return total - sum(room)


def node_fragmentation(
    model: str, cpu_free: int, gpu_free: Sequence[int], typical: TypicalTasks
) -> float:
    """The expected unusable GPU share of a node for the workload (milli-GPUs)."""
    return sum(share * task_fragment(model, cpu_free, gpu_free, t) for t, share in typical)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# --- placement policies ----------------------------------------------------------------------

Scored = tuple[float, Devices]


class Policy:
    """Scores one node for one task; higher is better. `options` is never empty."""

    name = "policy"
    random = False  # True: any node the task fits on, uniformly (no score)

    def score(self, node: GpuNode, index: int, task: GpuTask, options: list[Devices]) -> Scored:
        raise NotImplementedError


class FirstFit(Policy):
    """The first node (in the cluster's order) and the first device with room."""

    name = "first-fit"

    def score(self, node: GpuNode, index: int, task: GpuTask, options: list[Devices]) -> Scored:
        return -index, options[0]


class RandomFit(Policy):
    """Any node the task fits on and any device with room, uniformly (the paper's Random)."""

    name = "random"
    random = True


class BestFit(Policy):
    """The node with the least CPU and GPU left after placing (half weight each, against a
    128-core, 8-GPU node), in whole points of 100 as the simulator scores; best-fit device."""

    name = "best-fit"

    def score(self, node: GpuNode, index: int, task: GpuTask, options: list[Devices]) -> Scored:
        left = 0.5 * (node.cpu_free - task.cpu_milli) / MAX_SPEC_CPU
        left += 0.5 * (node.gpu_free_total - task.gpu_total) / MAX_SPEC_GPU
        return int((1.0 - left) * MAX_SCORE), best_fit_device(node.gpu_free, options)


class DotProduct(Policy):
    """Tetris' alignment, as the paper's DotProd baseline uses it: the smallest dot product of
    (free CPU, free GPU) and (asked CPU, asked GPU), each over the 128-core, 8-GPU bound."""

    name = "dot-product"

    def score(self, node: GpuNode, index: int, task: GpuTask, options: list[Devices]) -> Scored:
        dot = node.cpu_free / MAX_SPEC_CPU * task.cpu_milli / MAX_SPEC_CPU
        dot += node.gpu_free_total / MAX_SPEC_GPU * task.gpu_total / MAX_SPEC_GPU
        return int(MAX_SCORE * (1.0 - dot / 2)), best_fit_device(node.gpu_free, options)


class GpuPacking(Policy):
    """Fill shared devices first, then free devices of used nodes, then empty nodes."""

    name = "gpu-packing"

    def score(self, node: GpuNode, index: int, task: GpuTask, options: list[Devices]) -> Scored:
        devices = best_fit_device(node.gpu_free, options)
        if task.num_gpu == 0:
            return 0, devices
        whole_free = sum(1 for free in node.gpu_free if free == MILLI)
        if whole_free == node.gpus:  # an untouched node: last, fewer GPUs first
            return max(MAX_SCORE // 3 - whole_free, whole_free), devices
        taken_whole = sum(1 for d in devices if node.gpu_free[d] == MILLI)
        if taken_whole:
            return max(MAX_SCORE // 2 - taken_whole, MAX_SCORE // 3), devices
        room = sum(node.gpu_free[d] * 100 // MILLI for d in devices)
        return max(MAX_SCORE - room // 10, MAX_SCORE // 2), devices


class GpuClustering(Policy):
    """Put tasks of one kind (share, 1, 2, 4 or 8 GPUs) together: nodes holding only that kind
    first, then nodes holding it among others, empty nodes, the rest; fuller first in each."""

    name = "gpu-clustering"

    def score(self, node: GpuNode, index: int, task: GpuTask, options: list[Devices]) -> Scored:
        devices = best_fit_device(node.gpu_free, options)
        if task.num_gpu == 0:
            return 0, devices
        quarter = MAX_SCORE // 4
        fullness = quarter * (MAX_SPEC_GPU - node.gpu_free_total) // MAX_SPEC_GPU
        kinds = [tag for tag, count in node.tags.items() if count]
        if task.tag in kinds:
            return fullness + (3 if len(kinds) == 1 else 2) * quarter, devices
        return fullness + (quarter if not kinds else 0), devices


class FGD(Policy):
    """Fragmentation gradient descent: the node and device whose placement grows the node's
    (and so the cluster's) expected fragmentation least.

    As the authors' simulator scores it (`FGDScore`, `hkust-adsl/kubernetes-scheduler-simulator`):
    each way of placing the task on the node is scored sigmoid(-growth / 1000) in whole points
    of 100; the node's score is the best of them, and the device the first (lowest index)
    reaching it. Equal nodes are left to `Cluster`'s tie rule (the first in the cluster's
    order, which is what the authors' scheduler does: the smallest node name). Growths within
    a few tens of milli-GPUs score the same, so both choices among equals matter; measured
    on the trace in docs/benchmarks.md. `quantized=False` compares the exact growths instead
    (the device: the least growth), an ablation."""

    name = "fgd"

    def __init__(self, typical: TypicalTasks, *, quantized: bool = True) -> None:
        self.typical = typical
        self.quantized = quantized
        self._memo: dict[tuple[str, int, tuple[int, ...]], float] = {}

    def fragmentation(self, model: str, cpu_free: int, gpu_free: Sequence[int]) -> float:
        key = (model, cpu_free, tuple(sorted(gpu_free)))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = node_fragmentation(model, cpu_free, key[2], self.typical)
        return found

    def growth(self, node: GpuNode, task: GpuTask, devices: Devices) -> float:
        """How much placing `task` on `devices` grows `node`'s fragmentation."""
        after = list(node.gpu_free)
        for device in devices:
            after[device] -= task.gpu_milli
        cpu_after = node.cpu_free - task.cpu_milli
        before = self.fragmentation(node.model, node.cpu_free, node.gpu_free)
        return self.fragmentation(node.model, cpu_after, after) - before

    def value(self, growth: float) -> float:
        """The score of a growth: the simulator's whole points, or (exact) its negation."""
        if self.quantized:
            return int(sigmoid(-growth / MILLI) * MAX_SCORE)
        return -growth

    def score(self, node: GpuNode, index: int, task: GpuTask, options: list[Devices]) -> Scored:
        """The best `value` over `options` and the first devices (lowest index) reaching it;
        devices with the same free share score the same, so each share is tried once."""
        best: Scored | None = None
        tried: set[int] = set()
        for devices in options:
            if task.fraction:
                if node.gpu_free[devices[0]] in tried:
                    continue
                tried.add(node.gpu_free[devices[0]])
            value = self.value(self.growth(node, task, devices))
            if best is None or value > best[0]:
                best = (value, devices)
        assert best is not None
        return best


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (FirstFit, BestFit, GpuPacking, GpuClustering, DotProduct, RandomFit)
}


class Cluster:
    """Nodes under one policy: `place` puts a task on the best node, or says it fits nowhere.

    Among equally scored nodes the first in the cluster's order wins (`random_ties`: one at
    random, as Kubernetes' scheduler picks); the FGD authors' simulator behaves like the
    former on the trace (docs/benchmarks.md), and coarse scores such as GPU packing's tie often.

    Each node keeps what the policy said about each task shape since the node last changed,
    so a placement recomputes one node, not the cluster (the Random policy keeps only where
    a shape fits)."""

    def __init__(
        self,
        nodes: Iterable[GpuNode],
        policy: Policy,
        rng: random.Random,
        *,
        random_ties: bool = False,
    ) -> None:
        self.nodes = list(nodes)
        self.policy = policy
        self.rng = rng
        self.random_ties = random_ties  # False: the first best node in the cluster's order
        self.capacity = sum(node.gpus for node in self.nodes) * MILLI
        self.allocated = 0  # milli-GPUs
        self._kinds: dict[GpuTask, int] = {}
        self._scored: list[dict[int, Scored | None]] = [{} for _ in self.nodes]
        self._options: list[dict[int, list[Devices]]] = [{} for _ in self.nodes]

    def place(self, task: GpuTask) -> tuple[int, Devices] | None:
        """Place `task` where the policy scores best (ties at random); None if nowhere."""
        kind = self._kinds.setdefault(task, len(self._kinds))
        chosen = self._any_fit(task, kind) if self.policy.random else self._best(task, kind)
        if chosen is None:
            return None
        index, devices = chosen
        self.nodes[index].place(task, devices)
        self._scored[index].clear()
        self._options[index].clear()
        self.allocated += task.gpu_total
        return index, devices

    def _score(self, index: int, task: GpuTask) -> Scored | None:
        options = fits(self.nodes[index], task)
        return self.policy.score(self.nodes[index], index, task, options) if options else None

    def _best(self, task: GpuTask, kind: int) -> tuple[int, Devices] | None:
        best: float = -math.inf
        ties: list[int] = []
        chosen: dict[int, Devices] = {}
        for index, said in enumerate(self._scored):
            if kind in said:
                scored = said[kind]
            else:
                scored = said[kind] = self._score(index, task)
            if scored is None or scored[0] < best:
                continue
            if scored[0] > best:
                best, ties = scored[0], []
            ties.append(index)
            chosen[index] = scored[1]
        if not ties:
            return None
        index = self.rng.choice(ties) if self.random_ties and len(ties) > 1 else ties[0]
        return index, chosen[index]

    def _any_fit(self, task: GpuTask, kind: int) -> tuple[int, Devices] | None:
        feasible: list[int] = []
        for index, known in enumerate(self._options):
            options = known.get(kind)
            if options is None:
                options = known[kind] = fits(self.nodes[index], task)
            if options:
                feasible.append(index)
        if not feasible:
            return None
        index = self.rng.choice(feasible)
        return index, self.rng.choice(self._options[index][kind])
