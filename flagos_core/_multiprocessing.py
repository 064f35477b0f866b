"""flagos tensors through torch.multiprocessing (queues, pipes, a Process's
arguments): shared with the receiving process as the native device's tensors
are, never copied.

A flagos tensor travels as its native alias, by the native device's own
sharing (CUDA IPC with flagos-cuda), and the receiver makes it a flagos
tensor again over the same memory. On the host runtime, whose memory is
host RAM, the storage first moves into shared memory, in place, as a CPU
storage does when sent (`share_memory_`); the move happens once per
storage, and flagos tensors over it keep working on the shared copy.
"""

from multiprocessing.reduction import ForkingPickler

import torch
from torch.multiprocessing import reductions

from . import _C

BACKEND = "flagos"


def install():
    """Once, at import: flagos tensors get their own reduction, other tensors
    keep torch's; on the host runtime, flagos storages move into shared
    memory on share_memory_ as CPU ones do."""
    for cls in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(cls, reduce_tensor)
    _install_share_memory()


def _install_share_memory():
    """share_memory_ and is_shared on flagos storages do what they do on the
    native device's. torch's share_memory_ moves only CPU storages, and its
    is_shared calls only CUDA's shared otherwise (CUDA memory is shared by
    IPC when sent). Host-runtime memory is host RAM, which a forked child
    (Hogwild training after `model.share_memory()`) sees only if it is
    shared: it was not, and the child's updates were lost without a word.
    So there flagos storages move as CPU ones do; with an accelerator's
    runtime they stay as they are, and is_shared answers as for the native
    device's memory."""
    torch_share = torch.UntypedStorage.share_memory_
    torch_is_shared = torch.UntypedStorage.is_shared
    on_host = _C._native_device_type() == "cpu"

    def share_memory_(self, *args, **kwargs):
        if self.device.type != BACKEND:
            return torch_share(self, *args, **kwargs)
        if on_host:
            _shared_bytes(_tensor_over(self))
        return self

    def is_shared(self):
        if self.device.type != BACKEND:
            return torch_is_shared(self)
        if not on_host:
            return _C._to_native(_tensor_over(self)).untyped_storage().is_shared()
        whole = _C._wrapped_native_bytes(_tensor_over(self))
        return whole is not None and whole.is_shared()

    share_memory_.__doc__ = torch_share.__doc__
    is_shared.__doc__ = torch_is_shared.__doc__
    torch.UntypedStorage.share_memory_ = share_memory_
    torch.UntypedStorage.is_shared = is_shared


def _tensor_over(storage):
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _shared_bytes(tensor):
    """The host memory under `tensor`, moved into shared memory first (in
    place, once per storage: flagos tensors over it keep working on it)."""
    whole = _C._wrapped_native_bytes(tensor)
    if whole is None or not whole.is_shared():
        whole = torch.empty(tensor.untyped_storage().nbytes(), dtype=torch.uint8).share_memory_()
        _C._move_storage_onto(tensor, whole)
    return whole


def reduce_tensor(tensor):
    if tensor.device.type != torch._C._get_privateuse1_backend_name():
        return reductions.reduce_tensor(tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "flagos: a tensor that requires grad and is not a leaf cannot be sent to another process (its "
            "autograd graph cannot go along); send tensor.detach(), as torch.multiprocessing asks for any device"
        )
    rebuild, args = reductions.reduce_tensor(_shareable_native(tensor))
    parameter = isinstance(tensor, torch.nn.Parameter)
    return (rebuild_flagos, (rebuild, args, tensor.device.index, tensor.requires_grad, parameter))


def _shareable_native(tensor):
    """The native tensor the receiver maps: the alias, over shared memory."""
    if _C._native_device_type() != "cpu":
        return _C._to_native(tensor)
    whole = _shared_bytes(tensor)
    native = torch.empty(0, dtype=tensor.dtype)
    return native.set_(whole.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())


def rebuild_flagos(rebuild, args, index, requires_grad, parameter):
    """In the receiving process: the native tensor rebuilt, as a flagos tensor."""
    tensor = _C._from_native(rebuild(*args), index)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)
