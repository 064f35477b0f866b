"""DLPack: a flagos tensor is exported as the native device's memory
(flagos_core/_dlpack.py), so consumers that take the native device's arrays
(CuPy and JAX for CUDA, NumPy for the CPU) take flagos tensors zero-copy;
torch.from_dlpack of a flagos tensor gives a flagos tensor over the same
memory. Runs on every runtime: the native device is CPU on the host runtime
and CUDA with flagos-cuda."""

import gc

import pytest
import torch

import flagos_core  # noqa: F401
from native_reference import native_device

pytestmark = pytest.mark.native


def _values(device):
    return torch.arange(12, dtype=torch.float32).reshape(3, 4).to(device)


def test_a_flagos_tensor_is_exported_as_native_memory():
    t = _values("flagos")
    native = native_device()
    assert t.__dlpack_device__() == _values(native).__dlpack_device__()
    # What a consumer of the native device's arrays gets: the same memory.
    taken = torch._C._from_dlpack(t.__dlpack__())
    assert taken.device.type == native.type and taken.data_ptr() == t.data_ptr()
    taken[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    # A strided view keeps its geometry.
    view = t[:, 1::2]
    taken_view = torch._C._from_dlpack(view.__dlpack__(max_version=(1, 0)))
    assert torch.equal(taken_view.cpu(), view.cpu()) and taken_view.stride() == view.stride()


def test_the_exported_memory_outlives_the_flagos_tensor():
    t = _values("flagos")
    taken = torch._C._from_dlpack(t.__dlpack__())
    del t
    gc.collect()
    reused = torch.full((3, 4), -1.0, device="flagos")  # would take freed memory of this size
    assert torch.equal(taken.cpu(), _values("cpu")) and reused.data_ptr() != taken.data_ptr()


def test_torch_from_dlpack_keeps_the_device():
    t = _values("flagos")
    for out in (torch.from_dlpack(t), torch.from_dlpack(torch.utils.dlpack.to_dlpack(t))):
        assert out.device == t.device and out.data_ptr() == t.data_ptr()
        assert torch.equal(out.cpu(), _values("cpu"))
    # Into flagos from the CPU's DLPack (a copy, as onto any other device).
    cpu = _values("cpu")
    moved = torch.from_dlpack(cpu, device="flagos")
    assert moved.device.type == "flagos" and torch.equal(moved.cpu(), cpu)


@pytest.mark.skipif(native_device().type != "cpu", reason="NumPy takes CPU memory only")
def test_numpy_takes_host_runtime_tensors_zero_copy():
    np = pytest.importorskip("numpy")
    t = _values("flagos")
    a = np.from_dlpack(t)
    a[2, 3] = -5.0
    assert t[2, 3].item() == -5.0 and a.shape == (3, 4)


def test_what_cannot_be_exported_is_refused_as_natively():
    cases = [
        (torch.ones(2, device="flagos", requires_grad=True), "require gradient"),
        (torch.ones(2, dtype=torch.complex64, device="flagos").conj(), "conjugate bit"),
        # A native view would drop the negation: CPU's own export gives the
        # un-negated values, flagos refuses.
        (torch._neg_view(torch.ones(2, device="flagos")), "negative bit"),
    ]
    for tensor, message in cases:
        with pytest.raises(BufferError, match=message):
            tensor.__dlpack__()
        with pytest.raises(BufferError, match=message):
            torch.from_dlpack(tensor)
    # Other devices' tensors keep torch's own handling.
    assert torch.from_dlpack(_values("cpu")).device.type == "cpu"
