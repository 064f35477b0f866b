"""flagos matches its native device bit for bit across PyTorch's OpInfo database.

The sweep itself lives in tests/opinfo_sweep.py (run it directly for a report
without pytest). Each (op, dtype) pair, for dtypes float32, bfloat16, int64
and bool where the op supports them on the native device, runs its first few
sample inputs natively and on flagos; a pair passes when every sample that ran
natively gives the same result (values, NaNs, dtype, shape, device) on flagos.
Pairs run in worker processes, so an op that crashes the interpreter is
recorded as a failure instead of ending the test run.

On the host runtime the native device is CPU. On an accelerator runtime (the
CUDA plugin) it is that device: flagos runs CUDA's kernels, so it must give
CUDA's bits. There ops without a CUDA kernel may legitimately go through
cpu_fallback (listed in the report, not asserted on), and pairs where CUDA
disagrees with itself are set aside (listed, neither passed nor failed).

On the host runtime the gradients are swept too (tests/opinfo_gradients.py):
every op that differs from CPU must be one of its known differences.
"""

import time

import pytest

import flagos_core

import opinfo_gradients
import opinfo_sweep

MIN_PASS_RATE = 0.99
MIN_PAIRS = 1000  # guard against a vacuous pass (op_db failing to load, every sample skipped)


def _assert_pass_rate(result):
    ran = result.ran
    assert len(ran) > MIN_PAIRS, f"only {len(ran)} (op, dtype) pairs ran:\n{result.report()}"
    assert result.rate >= MIN_PASS_RATE, (
        f"pass rate {100 * result.rate:.2f}% < {100 * MIN_PASS_RATE:.0f}%\n{result.report()}"
    )


@pytest.fixture(scope="module")
def sweep_result():
    if flagos_core.runtime()["name"] != "host":
        pytest.skip("bitwise equality with CPU holds on the host runtime only")
    result = opinfo_sweep.sweep_isolated()
    print()
    print(result.report())
    return result


def test_opinfo_sweep_matches_cpu_bitwise(sweep_result):
    _assert_pass_rate(sweep_result)


def test_opinfo_sweep_uses_no_cpu_fallback(sweep_result):
    fallbacks = sweep_result.fallbacks
    assert not fallbacks, "overloads served by cpu_fallback (overload: ops):\n" + "\n".join(
        f"  {overload}: {', '.join(ops)}" for overload, ops in fallbacks.items()
    )


@pytest.mark.gpu
def test_opinfo_sweep_matches_native_cuda():
    """flagos vs the runtime's own device (CUDA with the CUDA plugin), bitwise.

    Deterministic algorithms on both sides, the native side run twice, pairs
    spread over worker processes (opinfo_sweep.accelerator_options). Forward
    only: a native CUDA backward fails in a process where flagos is registered
    (pytorch/pytorch#161129). `pytest --noconftest` runs it on CPU-only
    machines too, against CPU.
    """
    native = opinfo_sweep.native_device()
    start = time.perf_counter()
    result = opinfo_sweep.sweep_isolated(native=native, **opinfo_sweep.accelerator_options())
    print()
    print(result.report())
    print(f"{len(result.fallbacks)} overloads went through cpu_fallback (allowed here); "
          f"{len(result.unstable)} pairs set aside as nondeterministic on {native}; "
          f"sweep took {time.perf_counter() - start:.0f}s")
    _assert_pass_rate(result)


def test_opinfo_gradients_match_cpu_bitwise():
    if flagos_core.runtime()["name"] != "host":
        pytest.skip("a native accelerator's backward cannot run beside flagos; the host runtime only")
    result = opinfo_gradients.sweep()
    print()
    print(result.report())
    assert result.ran > 900, result.report()  # guard against a vacuous pass
    unexplained = {op: error for op, error in result.failures.items() if op not in opinfo_gradients.KNOWN_DIFFERENCES}
    assert unexplained == {}, result.report()
