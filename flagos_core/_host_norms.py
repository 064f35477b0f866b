"""`rms_norm` with autograd on the host runtime decomposes as on the CPU.

PyTorch's `rms_norm` calls `_fused_rms_norm` on every device. CUDA has a
kernel for it (with a fused backward); the CPU has none and runs the op's
composite kernel, a decomposition whose gradients autograd takes through its
ops. flagos has a backend kernel for `_fused_rms_norm` (the native device's
when it has one, else the composite provider's), so on the host runtime its
gradients came from the fused backward and differed from CPU's by rounding.
On the host runtime `_fused_rms_norm` therefore takes the CPU's path: its
composite kernel, called directly, whose ops record their own gradients and
run CPU's kernels, so outputs and gradients equal CPU's bitwise. Registered
for AutogradPrivateUse1 and PrivateUse1 (inference mode), as _host_rnn.py's
kernels.
"""

import warnings

import torch

from ._host_rnn import _not_traced, _pytorchs_decomposition

_LIBRARY = None


@_not_traced
def _fused_rms_norm(input, normalized_shape, weight, eps):
    return _pytorchs_decomposition(torch.ops.aten._fused_rms_norm.default, input, normalized_shape, weight, eps)


def register():
    """Once, when the host runtime is activated."""
    global _LIBRARY
    if _LIBRARY is None:
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            # The core's own PrivateUse1 kernel is replaced on purpose; PyTorch
            # would warn that it is overridden.
            warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
            for key in ("AutogradPrivateUse1", "PrivateUse1"):
                library.impl("_fused_rms_norm", _fused_rms_norm, key)
        _LIBRARY = library
