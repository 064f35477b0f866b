"""torch.cuda.jiterator on flagos tensors. A jiterator kernel is a CUDA kernel
launched by torch._C directly, not an ATen operator, so the router never sees
it: flagos arguments go in as zero-copy CUDA aliases and the results come back
as flagos tensors over the same memory."""

import torch

import flagos_core

_launch = None  # torch's own launcher


def _is_flagos(t):
    return isinstance(t, torch.Tensor) and t.device.type == "flagos"


def _launch_with_flagos(code, name, return_by_ref, num_outputs, tensors, kwargs):
    flagos = [t for t in tensors if _is_flagos(t)]
    if not flagos:
        return _launch(code, name, return_by_ref, num_outputs, tensors, kwargs)
    device = flagos[0].device
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device != device and not (t.dim() == 0 and t.device.type == "cpu"):
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, {device} and "
                f"{t.device}! (jiterator kernel {name})")
    native = tuple(flagos_core.as_native(t) if _is_flagos(t) else t for t in tensors)
    out = _launch(code, name, return_by_ref, num_outputs, native, kwargs)
    if isinstance(out, torch.Tensor):
        return flagos_core.from_native(out, device.index)
    return type(out)(flagos_core.from_native(t, device.index) for t in out)


def install():
    global _launch
    if _launch is None and hasattr(torch._C, "_cuda_jiterator_compile_and_launch_kernel"):
        _launch = torch._C._cuda_jiterator_compile_and_launch_kernel
        torch._C._cuda_jiterator_compile_and_launch_kernel = _launch_with_flagos
