"""flagos_core.as_native: a native-device tensor over a flagos tensor's
memory, without a copy. Natively, tensors that share memory share one
storage, so when it moves (a resize_ that grows it, share_memory_) all of
them see the new memory. The exported tensor must do the same when its
flagos tensor's storage moves: it used to keep the old pointer, into memory
that the move had freed, and read whatever reused it."""

import threading

import pytest
import torch

import flagos_core

pytestmark = pytest.mark.native


def _grow(t):
    t.resize_(4096)  # the storage reallocates; the first six elements are copied


def _grow_storage(t):
    t.untyped_storage().resize_(4096 * t.element_size())


def _share(t):
    t.share_memory_()  # a no-op on CUDA; on CPU the storage moves into shared memory


def _reuse_freed_memory(device):
    return [torch.full((1 << 16,), 7.0, device=device) for _ in range(4)]


@pytest.mark.parametrize("move", [_grow, _grow_storage, _share], ids=["resize_", "storage resize_", "share_memory_"])
def test_exported_tensor_follows_its_flagos_storage_as_a_native_one_does(native_device, move):
    # The reference: a native tensor and another over its storage.
    native = torch.arange(6.0, device=native_device)
    native_other = native.detach()
    flagos = torch.arange(6.0, device="flagos")
    exported = flagos_core.as_native(flagos)
    assert exported.device == native_other.device

    move(native)
    move(flagos)
    scratch = (_reuse_freed_memory(native_device), _reuse_freed_memory("flagos"))
    assert torch.equal(exported.cpu(), native_other.cpu())
    assert torch.equal(exported.cpu(), torch.arange(6.0))
    assert exported.untyped_storage().nbytes() == flagos.untyped_storage().nbytes()
    assert exported.data_ptr() == flagos.data_ptr()

    exported[0] = -1.0  # written natively, seen through flagos, and back
    flagos[1] = -2.0
    assert flagos[:2].tolist() == [-1.0, -2.0]
    assert exported[:2].tolist() == [-1.0, -2.0]
    del scratch


def test_exported_tensor_cannot_take_memory_of_its_own(native_device):
    flagos = torch.arange(6.0, device="flagos")
    exported = flagos_core.as_native(flagos)
    with pytest.raises(RuntimeError, match="shares its memory with a flagos tensor.*Resize the flagos tensor instead"):
        exported.resize_(4096)
    # As natively when a storage cannot grow, resize_ has set the sizes
    # before it raised; the memory is untouched, and still shared.
    exported.resize_(6)
    assert exported.data_ptr() == flagos.data_ptr()
    exported.mul_(2)
    assert torch.equal(flagos.cpu(), torch.arange(6.0) * 2)
    exported.resize_(3)  # shrinking takes no new memory, as natively
    assert exported.tolist() == [0.0, 2.0, 4.0]


def test_exported_tensor_of_a_wrapped_native_tensor_is_over_its_storage(native_device):
    native = torch.arange(6.0, device=native_device)
    exported = flagos_core.as_native(flagos_core.from_native(native))
    assert exported.untyped_storage().data_ptr() == native.untyped_storage().data_ptr()
    native.resize_(4096)  # the native storage moves; the export shares that storage
    native[0] = 50.0
    scratch = _reuse_freed_memory(native_device)
    assert exported.tolist() == [50.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    del scratch


def test_exported_tensor_outlives_its_flagos_tensor(native_device):
    flagos = torch.arange(6.0, device="flagos")
    exported = flagos_core.as_native(flagos)
    del flagos
    scratch = _reuse_freed_memory("flagos")
    assert exported.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    del scratch


def test_exports_made_and_dropped_by_threads(native_device):
    base = torch.arange(64.0, device="flagos")
    errors = []

    def work():
        try:
            for i in range(300):
                exported = flagos_core.as_native(base[i % 32:])
                assert exported[0].item() == float(i % 32)
        except Exception as e:  # surfaced below, with the thread's error
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    base.resize_(4096)  # every export is gone: the storage moves with none to follow
    assert base[:64].cpu().tolist() == [float(i) for i in range(64)]
