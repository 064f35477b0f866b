"""A function's results on the native device, to compare flagos's with.

On an accelerator (CUDA, ...) a backward cannot run in a process that loaded
flagos (pytorch/pytorch#161129, see flagos_core/_native_backward.py), so there
the function runs in a side process without flagos (benchmarks/side_process.py);
on the host runtime, whose native device is the CPU, it runs here. The
function takes the device (and any keyword arguments given here, plain
values) and returns a list of tensors, and uses nothing but torch: on an
accelerator its source is what runs.
"""

import inspect
import os
import sys
import textwrap

import torch

def native_device():
    """The device flagos results are compared with: CPU on the host runtime."""
    import flagos_core

    name = flagos_core.runtime()["name"]
    return torch.device("cpu" if name == "host" else name)


BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def results_on_native(fn, device, tmp_path, **kwargs):
    if device.type == "cpu":
        return [t.detach().cpu() for t in fn(device, **kwargs)]
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    from side_process import SideProcess

    code = textwrap.dedent(inspect.getsource(fn)) + (
        f"\nresult = [t.detach().cpu() for t in {fn.__name__}(torch.device({str(device)!r}), **{kwargs!r})]\n"
    )
    native = SideProcess(device.type)
    try:
        return torch.load(native("eval", code=code, path=str(tmp_path / "native.pt"))["path"])
    finally:
        native.close()


def assert_matches_native(flagos, native, **tolerance):
    """flagos's results (flagos tensors) against the native device's (CPU
    tensors from results_on_native): bitwise, or within `tolerance`
    (torch.testing.assert_close's rtol and atol) where one is given."""
    assert len(flagos) == len(native)
    for got, want in zip(flagos, native):
        assert got.device.type == "flagos"
        if tolerance:
            torch.testing.assert_close(got.cpu(), want, **tolerance)
        else:
            assert torch.equal(got.cpu(), want)


def compare_with_native(fn, device, tmp_path, **tolerance):
    """fn on flagos, with no call through cpu_fallback, against fn on the
    native device `device` (assert_matches_native, with `tolerance` if
    given); returns (flagos's results, the native device's)."""
    import flagos_core

    native = results_on_native(fn, device, tmp_path)
    with flagos_core.trace() as t:
        flagos = fn(torch.device("flagos"))
    assert t.fallbacks == []
    assert_matches_native(flagos, native, **tolerance)
    return flagos, native
