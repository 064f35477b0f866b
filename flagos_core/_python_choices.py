"""PyTorch's Python code that picks by device type takes the native device's
pick for flagos tensors.

`F.linear_cross_entropy` with `LinearCrossEntropyOptions` (torch 2.13+)
resolves its "auto" accumulation policy, accumulation dtype and chunking
from tables keyed by device type, which know "cpu" and "cuda". A flagos
device took the fallback pick: for bf16 and fp16 a lower-precision
accumulation than the native device's, and another loss. Here the options
resolve against the native device (`flagos:i` is `cuda:i` with
flagos-cuda, the CPU on the host runtime), so the loss is the native
device's.
"""

import torch

from . import _C

BACKEND = "flagos"


def install():
    try:
        from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions
    except ImportError:  # a torch without it
        return
    torch_adjust = LinearCrossEntropyOptions._adjust

    def _adjust(self, num_batches, in_features, num_classes, dtype, device=None):
        if device is not None and torch.device(device).type == BACKEND:
            device = _C._native_device(torch.device(device).index or 0)  # flagos:i's native device
        return torch_adjust(self, num_batches, in_features, num_classes, dtype, device)

    _adjust.__doc__ = torch_adjust.__doc__
    LinearCrossEntropyOptions._adjust = _adjust

