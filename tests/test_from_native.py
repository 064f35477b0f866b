"""flagos_core.from_native: a flagos tensor over a native tensor's memory,
without a copy. It must stay over that memory as a native view of the same
storage does, also when the native storage moves afterwards (share_memory_
into shared memory, a resize_ that grows it): the old memory is freed then,
and a flagos tensor still pointing there read garbage. Growing the flagos
tensor grows the native storage, as growing one of two native tensors over
a storage does."""

import pytest
import torch

import flagos_core

pytestmark = pytest.mark.native


def _share(t):
    t.share_memory_()  # a no-op on CUDA; on CPU the storage moves into shared memory


def _grow(t):
    t.resize_(4096)  # the storage reallocates; the first six elements are copied


@pytest.mark.parametrize("move", [_share, _grow], ids=["share_memory_", "resize_ growing"])
def test_follows_its_native_storage_as_a_native_view_does(native_device, move):
    native = torch.arange(6.0, device=native_device)
    flagos = flagos_core.from_native(native)
    view = native[:]  # the reference: a native tensor over the same storage
    assert torch.equal(flagos.cpu(), view.cpu())

    move(native)
    native[:6] = torch.tensor([10.0, 11, 12, 13, 14, 15])
    # Whatever reuses the freed memory must not show through flagos.
    scratch = torch.full((1 << 20,), 7.0, device=native_device)
    assert torch.equal(flagos.cpu(), view.cpu())
    assert torch.equal(flagos.cpu(), torch.tensor([10.0, 11, 12, 13, 14, 15]))
    assert flagos.data_ptr() == native.data_ptr() == view.data_ptr()

    flagos.add_(1)  # written through flagos, seen natively
    assert torch.equal(native[:6].cpu(), torch.tensor([11.0, 12, 13, 14, 15, 16]))
    assert torch.equal(view.cpu(), native[:6].cpu())
    del scratch


def test_writes_are_seen_both_ways(native_device):
    native = torch.zeros(4, device=native_device)
    flagos = flagos_core.from_native(native)
    assert flagos.device.type == "flagos"
    native.fill_(2.0)
    assert torch.equal(flagos.cpu(), torch.full((4,), 2.0))
    flagos.mul_(3)
    assert torch.equal(native.cpu(), torch.full((4,), 6.0))


def test_growing_the_flagos_tensor_grows_the_native_storage(native_device):
    # The reference: natively, growing one of two tensors over a storage
    # gives that storage the new memory, and the other tensor sees it.
    reference = torch.arange(6.0, device=native_device)
    reference.detach().resize_(4096)
    native = torch.arange(6.0, device=native_device)
    flagos = flagos_core.from_native(native)

    flagos.resize_(4096)
    scratch = torch.full((1 << 20,), 7.0, device=native_device)  # reuses the memory given up
    assert native.untyped_storage().nbytes() == reference.untyped_storage().nbytes()
    assert flagos.data_ptr() == native.data_ptr()
    assert torch.equal(native.cpu(), reference.cpu())
    flagos[:6] += 10.0
    native[0] = -1.0
    assert flagos[:6].cpu().tolist() == [-1.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert torch.equal(native.cpu(), flagos[:6].cpu())
    del scratch


def test_storage_resize_of_a_wrapped_storage_names_what_to_resize(native_device):
    flagos = flagos_core.from_native(torch.arange(6.0, device=native_device))
    with pytest.raises(RuntimeError, match="from_native.*resize the flagos tensor"):
        flagos.untyped_storage().resize_(4096)
    assert flagos.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
