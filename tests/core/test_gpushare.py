"""scheduler/core/gpushare.py: fractional fit, the placement policies and FGD's fragmentation,
against examples worked by hand from the FGD paper's definitions (Weng et al., ATC '23)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.gpushare import (
    FGD,
    MILLI,
    POLICIES,
    BestFit,
    Cluster,
    GpuNode,
    GpuTask,
    Policy,
    device_options,
    fits,
    node_fragmentation,
    task_fragment,
    typical_tasks,
)


def gpu_node(name: str, free: list[int], cpu: int = 32_000, model: str = "T4") -> GpuNode:
    node = GpuNode(name, model, cpu, 256_000, len(free))
    node.gpu_free = list(free)
    return node


def share(milli: int, cpu: int = 1000) -> GpuTask:
    return GpuTask(cpu_milli=cpu, num_gpu=1, gpu_milli=milli)


def whole(n: int, cpu: int = 1000) -> GpuTask:
    return GpuTask(cpu_milli=cpu, num_gpu=n, gpu_milli=MILLI)


CPU_ONLY = GpuTask(cpu_milli=1000)

# --- what a task may ask for -----------------------------------------------------------------

BAD_TASKS = [
    ({"cpu_milli": 1, "num_gpu": 2, "gpu_milli": 500}, "never spans devices"),
    ({"cpu_milli": 1, "num_gpu": 0, "gpu_milli": 100}, "needs num_gpu"),
    ({"cpu_milli": 1, "num_gpu": 1, "gpu_milli": 0}, "gpu_milli must be"),
    ({"cpu_milli": 1, "num_gpu": 1, "gpu_milli": 1001}, "gpu_milli must be"),
    ({"cpu_milli": -1}, "must not be negative"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_TASKS)
def test_it_refuses_a_task_that_cannot_exist(fields: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GpuTask(
            fields["cpu_milli"],
            num_gpu=fields.get("num_gpu", 0),
            gpu_milli=fields.get("gpu_milli", 0),
        )


# --- where a task fits -----------------------------------------------------------------------

FIT_CASES = [
    # free shares, task, the device choices
    ([1000, 1000], share(300), [(0,), (1,)]),
    ([200, 700, 1000], share(500), [(1,), (2,)]),
    ([200, 400], share(500), []),  # 600 free in all, but a fraction never spans devices
    ([1000, 900, 1000], whole(2), [(0, 2)]),  # whole GPUs only on fully free devices
    ([1000, 900, 1000], whole(3), []),  # never on a shared one
    ([999, 999], whole(1), []),
    ([0, 0], CPU_ONLY, [()]),
]


@pytest.mark.parametrize(("free", "task", "expected"), FIT_CASES)
def test_it_offers_only_devices_with_room(free: list[int], task: GpuTask, expected: list) -> None:
    assert device_options(free, task) == expected


def test_it_refuses_a_node_short_of_cpu_memory_or_the_wanted_model() -> None:
    node = gpu_node("a", [1000], cpu=4000, model="T4")
    assert fits(node, share(500, cpu=4000)) == [(0,)]
    assert fits(node, share(500, cpu=4001)) == []
    assert fits(node, GpuTask(1000, memory_mib=256_001, num_gpu=1, gpu_milli=500)) == []
    t4_or_v100 = GpuTask(1000, num_gpu=1, gpu_milli=500, gpu_models=frozenset({"T4", "V100"}))
    assert fits(node, t4_or_v100) == [(0,)]
    assert fits(node, GpuTask(1000, num_gpu=1, gpu_milli=500, gpu_models=frozenset({"A10"}))) == []
    assert fits(node, GpuTask(1000, gpu_models=frozenset({"A10"}))) == [()]  # CPU tasks: any


def test_placing_refuses_what_would_over_allocate() -> None:
    node = gpu_node("a", [300, 1000])
    with pytest.raises(ValueError, match="cannot take"):
        node.place(share(400), (0,))
    with pytest.raises(ValueError, match="cannot take"):
        node.place(whole(1), (0,))
    node.place(share(300), (0,))
    assert node.gpu_free == [0, 1000]


# --- fragmentation, worked by hand from the paper's definition -------------------------------

FREE = [1000, 1000, 500, 200]  # 2,700 milli-GPUs free on four devices
FRAGMENT_CASES = [
    (share(600), 700, "devices with 500 and 200 left cannot hold 600"),
    (share(500), 200, "only the 200 is too small"),
    (share(100), 0, "every device has room"),
    (whole(2), 700, "two whole GPUs fit; the partial devices are lost to it"),
    (whole(3), 2700, "only two devices are whole: it cannot run, all is fragment"),
    (share(100, cpu=9000), 2700, "not enough CPU: all is fragment"),
    (CPU_ONLY, 2700, "a task asking no GPU uses none of it"),
    (GpuTask(1000, num_gpu=1, gpu_milli=100, gpu_models=frozenset({"A10"})), 2700, "wrong model"),
]


@pytest.mark.parametrize(("task", "expected", "why"), FRAGMENT_CASES)
def test_task_fragment_matches_the_hand_worked_value(
    task: GpuTask, expected: int, why: str
) -> None:
    assert task_fragment("T4", 8000, FREE, task) == expected, why


def test_node_fragmentation_is_the_popularity_weighted_expectation() -> None:
    # A quarter of the workload asks no GPU (all 1,300 free is fragment to it), three
    # quarters ask for half a GPU (the device with 300 left is fragment to them).
    workload = ((CPU_ONLY, 0.25), (share(500), 0.75))
    assert node_fragmentation("T4", 8000, [300, 1000], workload) == 0.25 * 1300 + 0.75 * 300


def test_typical_tasks_keep_the_popular_shapes_covering_95_percent() -> None:
    tasks = [share(500)] * 60 + [whole(1)] * 36 + [whole(8)] * 3 + [CPU_ONLY]
    typical = typical_tasks(tasks)
    assert [(t.shape, round(p, 4)) for t, p in typical] == [
        (share(500).shape, round(60 / 96, 4)),
        (whole(1).shape, round(36 / 96, 4)),
    ]


@pytest.mark.parametrize("quantized", [False, True])
def test_fgd_avoids_the_fragment_best_fit_would_leave(quantized: bool) -> None:
    # Every task of the workload asks half a GPU. A 300 task on X (600 free) leaves 300 that
    # no such task can use (growth +300); on Y (800 free) it leaves 500, still usable
    # (growth 0). Best fit takes the tighter X; FGD takes Y.
    workload = ((share(500), 1.0),)
    nodes = [gpu_node("x", [600]), gpu_node("y", [800])]
    fgd = FGD(workload, quantized=quantized)
    assert fgd.growth(nodes[0], share(300), (0,)) == 300
    assert fgd.growth(nodes[1], share(300), (0,)) == 0
    assert Cluster(nodes, fgd, random.Random(1)).place(share(300)) == (1, (0,))
    others = [gpu_node("x", [600]), gpu_node("y", [800])]
    assert Cluster(others, BestFit(), random.Random(1)).place(share(300)) == (0, (0,))


def test_fgd_fills_a_fragment_and_picks_the_device_within_the_node() -> None:
    # Half-GPU workload; the node has a 300 fragment and a whole device. A 300 task on the
    # fragment removes it (growth -300); on the whole device it leaves 700 (growth 0).
    fgd = FGD(((share(500), 1.0),), quantized=False)
    node = gpu_node("x", [1000, 300])
    assert Cluster([node], fgd, random.Random(1)).place(share(300)) == (0, (1,))
    assert node.gpu_free == [1000, 0]


def test_fgd_scores_each_device_in_whole_points_and_takes_the_first_best() -> None:
    # As the authors' FGDScore: 20 on the 400 fragment shrinks it (growth -20), on the whole
    # device it leaves 980, still usable (growth 0); both are 50 points, so the first device
    # wins. Compared exactly, the fragment does.
    task, workload = share(20), ((share(500), 1.0),)
    node = gpu_node("x", [1000, 400])
    assert Cluster([node], FGD(workload), random.Random(1)).place(task) == (0, (0,))
    exact = gpu_node("x", [1000, 400])
    assert Cluster([exact], FGD(workload, quantized=False), random.Random(1)).place(task) == (
        0,
        (1,),
    )


@pytest.mark.parametrize("quantized", [False, True])
def test_fgd_leaves_equal_nodes_to_the_cluster_order(quantized: bool) -> None:
    # Half a GPU on either node grows nothing (500 left is still usable): the first node in
    # the cluster's order takes it, as the authors' scheduler takes the smallest node name,
    # not the one left fuller (b).
    nodes = [gpu_node("a", [1000, 1000]), gpu_node("b", [1000])]
    fgd = FGD(((share(500), 1.0),), quantized=quantized)
    assert Cluster(nodes, fgd, random.Random(1)).place(share(500)) == (0, (0,))


# --- no over-allocation, whatever the policy -------------------------------------------------

TASKS = st.one_of(
    st.builds(share, st.integers(1, 999), st.integers(0, 16_000)),
    st.builds(whole, st.sampled_from([1, 2, 4, 8]), st.integers(0, 16_000)),
    st.builds(GpuTask, st.integers(0, 16_000)),
)


def make_policy(name: str, tasks: list[GpuTask]) -> Policy:
    return FGD(typical_tasks(tasks)) if name == "fgd" else POLICIES[name]()


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=5),
    tasks=st.lists(TASKS, min_size=1, max_size=40),
    policy=st.sampled_from([*POLICIES, "fgd"]),
    seed=st.integers(0, 1000),
)
def test_no_policy_ever_over_allocates(
    gpus: list[int], tasks: list[GpuTask], policy: str, seed: int
) -> None:
    nodes = [GpuNode(f"n{i}", "T4", 32_000, 128_000, n) for i, n in enumerate(gpus)]
    cluster = Cluster(nodes, make_policy(policy, tasks), random.Random(seed))
    for task in tasks:
        before = [list(node.gpu_free) for node in nodes]
        placed = cluster.place(task)
        if placed is None:
            assert all(fits(node, task) == [] for node in nodes)
            continue
        index, devices = placed
        assert len(devices) == task.num_gpu
        if task.num_gpu > 1 or task.gpu_milli == MILLI:
            assert all(before[index][d] == MILLI for d in devices)  # whole GPUs never share
        for node in nodes:
            assert node.cpu_free >= 0 and node.mem_free >= 0
            assert all(0 <= free <= MILLI for free in node.gpu_free)
    used = sum(node.gpus * MILLI - node.gpu_free_total for node in nodes)
    assert cluster.allocated == used


def test_ties_go_to_the_first_node_in_order_unless_asked_to_be_random() -> None:
    def chosen(seed: int, random_ties: bool) -> int:
        nodes = [gpu_node("a", [1000]), gpu_node("b", [1000])]  # best fit scores them equal
        cluster = Cluster(nodes, BestFit(), random.Random(seed), random_ties=random_ties)
        placed = cluster.place(share(500))
        assert placed is not None
        return placed[0]

    assert {chosen(seed, random_ties=False) for seed in range(20)} == {0}
    assert {chosen(seed, random_ties=True) for seed in range(20)} == {0, 1}
