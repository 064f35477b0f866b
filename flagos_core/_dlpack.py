"""DLPack export of flagos tensors as the native device's memory.

flagos memory is the native device's (CUDA's with the CUDA plugin, host RAM
on the host runtime), so a flagos tensor is exported as a native alias of
it: `cupy.from_dlpack(t)` or JAX takes a flagos tensor zero-copy as it takes
a CUDA tensor, with CUDA's stream handshake, and on the host runtime NumPy
takes one as a CPU array. torch's own `Tensor.__dlpack_device__` names a
PrivateUse1 device only under the name "privateuse1", so for a renamed
backend it raised "Unknown device type flagos for Dlpack", and with it
`torch.from_dlpack(t)` and every consumer that asks for the device first.
`torch.from_dlpack(t)` of a flagos tensor gives a flagos tensor over the
same memory, as for a tensor of any torch device.
`torch.utils.dlpack.to_dlpack(t)`, which bypasses these methods, still
gives PyTorch's own capsule for the PrivateUse1 device (kDLExtDev), which
`torch.from_dlpack` turns back into a flagos tensor.
"""

import torch

from . import _C

BACKEND = "flagos"


def install():
    torch_export = torch.Tensor.__dlpack__
    torch_device = torch.Tensor.__dlpack_device__

    def __dlpack__(self, *, stream=-1, max_version=None, dl_device=None, copy=None):
        if not _exported_as_native(self):
            return torch_export(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
        _check_exportable(self)
        return _C._to_native(self).__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        if not _exported_as_native(self):
            return torch_device(self)
        return _C._to_native(self).__dlpack_device__()

    torch_from_dlpack = torch.utils.dlpack.from_dlpack

    def from_dlpack(ext_tensor, *, device=None, copy=None):
        out = torch_from_dlpack(ext_tensor, device=device, copy=copy)
        if device is None and isinstance(ext_tensor, torch.Tensor) and _exported_as_native(ext_tensor):
            return _C._from_native(out, ext_tensor.device.index)  # the same device, as torch's own
        return out

    __dlpack__.__doc__ = torch_export.__doc__
    __dlpack_device__.__doc__ = torch_device.__doc__
    from_dlpack.__doc__ = torch_from_dlpack.__doc__
    torch.Tensor.__dlpack__ = __dlpack__
    torch.Tensor.__dlpack_device__ = __dlpack_device__
    torch.utils.dlpack.from_dlpack = torch.from_dlpack = from_dlpack


def _exported_as_native(tensor):
    # A subclass with __torch_function__ gets torch's own handling (which
    # hands the call to its override).
    return tensor.device.type == BACKEND and not torch.overrides.has_torch_function_unary(tensor)


def _check_exportable(tensor):
    # What torch refuses for its own devices, with its messages: the native
    # alias carries neither the autograd state nor the conjugate or negative
    # bit, so without these checks a view's lazily applied conjugation or
    # negation would be lost from the exported values.
    if tensor.requires_grad:
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
    if tensor.is_conj():
        raise BufferError("Can't export tensors with the conjugate bit set")
    if tensor.is_neg():
        raise BufferError("Can't export tensors with the negative bit set")
    if tensor.layout != torch.strided:
        raise BufferError("Can't export tensors with layout other than torch.strided")
