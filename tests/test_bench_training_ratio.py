"""The training rows' ratio (benchmarks/order_balance.py, order_balanced):
an order effect that scales each pair's ratio cancels out, whichever order
has more pairs."""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from order_balance import order_balanced  # noqa: E402


def test_an_order_skew_cancels():
    true_ratio, skew = 0.99, 1.10  # the side that goes first runs 10% faster
    native_first, flagos_first = true_ratio / skew, true_ratio * skew
    # Three pairs with native first against one with flagos first: a plain
    # median would read native_first's value.
    ratios = [native_first, flagos_first, native_first, native_first]
    assert order_balanced(ratios, [False, True, False, False]) == pytest.approx(true_ratio)


def test_each_order_takes_its_median():
    ratios = [0.80, 1.20, 0.90, 1.00, 1.10, 1.05]
    firsts = [False, True, False, True, False, True]
    assert order_balanced(ratios, firsts) == pytest.approx(math.sqrt(0.90 * 1.05))


def test_one_order_only_is_the_median():
    assert order_balanced([0.95, 1.01, 0.97], [False, False, False]) == pytest.approx(0.97)
