"""benchmarks/bench_train_kernels.py's comparison of what the GPU ran on each
side: launches decide whether the kernels are the same, and the listing puts
the largest time differences first."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from bench_train_kernels import compare_kernels, device_totals  # noqa: E402


def test_same_kernels_and_launches_are_the_same_work():
    native = {"gemm": [4, 100.0], "softmax": [2, 10.0]}
    flagos = {"gemm": [4, 103.0], "softmax": [2, 9.0]}
    same, rows = compare_kernels(native, flagos)
    assert same
    assert [r[0] for r in rows] == ["gemm", "softmax"]  # |3.0| before |1.0|


def test_a_kernel_on_one_side_only_or_launched_more_often_differs():
    native = {"gemm": [4, 100.0]}
    assert not compare_kernels(native, {"gemm": [4, 100.0], "copy": [1, 2.0]})[0]
    assert not compare_kernels(native, {"gemm": [5, 125.0]})[0]
    same, rows = compare_kernels(native, {"gemm": [5, 125.0], "copy": [1, 2.0]})
    assert rows[0] == ("gemm", 4, 5, 100.0, 125.0)
    assert rows[1] == ("copy", 0, 1, 0.0, 2.0)


def test_totals_add_launches_and_time():
    assert device_totals({"a": [3, 1.5], "b": [1, 2.5]}) == (4, 4.0)
    assert device_totals({}) == (0, 0)
