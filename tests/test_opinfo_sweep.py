"""flagos matches CPU bit for bit across PyTorch's OpInfo database.

The sweep itself lives in tests/opinfo_sweep.py (run it directly for a report
without pytest). Each (op, dtype) pair, for dtypes float32, bfloat16, int64
and bool where the op supports them on CPU, runs its first few sample inputs
on CPU and on flagos; a pair passes when every sample that ran on CPU gives the
same result (values, NaNs, dtype, shape, device) on flagos. Pairs run in a
worker process, so an op that crashes the interpreter is recorded as a failure
instead of ending the test run.
"""

import pytest

import flagos_core

import opinfo_sweep

MIN_PASS_RATE = 0.99


@pytest.fixture(scope="module")
def sweep_result():
    if flagos_core.runtime()["name"] != "host":
        pytest.skip("bitwise equality with CPU holds on the host runtime only")
    result = opinfo_sweep.sweep_isolated()
    print()
    print(result.report())
    return result


def test_opinfo_sweep_matches_cpu_bitwise(sweep_result):
    ran = sweep_result.ran
    # Guard against a vacuous pass (op_db failing to load, every sample skipped).
    assert len(ran) > 1000, f"only {len(ran)} (op, dtype) pairs ran:\n{sweep_result.report()}"
    assert sweep_result.rate >= MIN_PASS_RATE, (
        f"pass rate {100 * sweep_result.rate:.2f}% < {100 * MIN_PASS_RATE:.0f}%\n{sweep_result.report()}"
    )


def test_opinfo_sweep_uses_no_cpu_fallback(sweep_result):
    fallbacks = sweep_result.fallbacks
    assert not fallbacks, "overloads served by cpu_fallback (overload: ops):\n" + "\n".join(
        f"  {overload}: {', '.join(ops)}" for overload, ops in fallbacks.items()
    )
