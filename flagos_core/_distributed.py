"""torch.distributed on flagos: collectives on flagos tensors run on the
native device's communication backend (gloo on the host runtime, NCCL with
the CUDA plugin), in place on the same memory.

`init_process_group()` picks that backend for flagos as it picks NCCL for
CUDA, and naming it (`init_process_group("gloo")`, `"nccl"`) covers flagos
tensors too. The C++ side (core/Collectives.cpp) serves the c10d operators.
"""

import torch

from . import _C


def install():
    """Once, at import, where this torch has torch.distributed."""
    if not torch.distributed.is_available():
        return
    from torch.distributed import Backend

    backend = Backend.default_device_backend_map.get(_C._native_device_type())
    if backend is None:  # no default for the native device: the user names one
        return
    backends_of = Backend.default_device_backend_map
    backends_of.setdefault(torch._C._get_privateuse1_backend_name(), backend)
    devices = Backend.backend_capability.setdefault(backend, [])
    if torch._C._get_privateuse1_backend_name() not in devices:
        devices.append(torch._C._get_privateuse1_backend_name())
    _C._serve_collectives()
