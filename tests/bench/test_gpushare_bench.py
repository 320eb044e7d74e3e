"""bench/gpushare.py: arrivals grown or cut to the demand target as the FGD authors' simulator
does, and the curve read at a demand level (issue #23)."""

from __future__ import annotations

import random

from bench.gpushare import arrivals, at
from scheduler.core.gpushare import GpuTask

POD_LIST = [
    GpuTask(1000, num_gpu=1, gpu_milli=500),
    GpuTask(1000, num_gpu=2, gpu_milli=1000),
    GpuTask(1000),
    GpuTask(1000, num_gpu=1, gpu_milli=250),
]  # 2,750 milli-GPUs asked in all


def test_arrivals_start_with_the_whole_list_shuffled_then_resample_up_to_the_target() -> None:
    sequence = arrivals(POD_LIST, capacity=10_000, tune=1.3, rng=random.Random(7))
    assert sorted(map(repr, sequence[:4])) == sorted(map(repr, POD_LIST))
    demand = sum(task.gpu_total for task in sequence)
    assert 13_000 - 2_000 < demand <= 13_000 + 1_000  # the stop test reads one device's share


def test_arrivals_cut_a_list_that_asks_for_more_than_the_target() -> None:
    sequence = arrivals(POD_LIST, capacity=1_000, tune=1.3, rng=random.Random(7))
    assert sum(task.gpu_total for task in sequence) <= 1_300 + 1_000


def test_the_curve_is_read_at_the_level_or_the_last_one_reached_below_it() -> None:
    curve = {0: 0.2, 1: 1.0, 99: 90.0}
    assert at(curve, 1) == 1.0
    assert at(curve, 100) == 90.0
    assert at({5: 1.0}, 1) is None
