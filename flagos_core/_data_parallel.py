"""nn.DataParallel (and torch.nn.parallel's replicate, scatter, gather) on
flagos devices.

DataParallel works on the current accelerator, which with a CPU build of
torch is flagos. Its copies between devices go through
torch.nn.parallel.comm, whose broadcast, scatter and gather are CUDA's C++
functions, absent from a CPU build: a DataParallel model failed there with
an AttributeError from torch's internals, on one flagos device as on
several. Here they are ordinary tensor ops on flagos tensors, with what
CUDA's return: a device's own tensor (or chunk) is returned as it is, not
copied; every other device gets a copy. With a CUDA build the accelerator
is CUDA, and DataParallel runs on CUDA devices as torch has it: these
functions are then torch's own.
"""

import torch

BACKEND = "flagos"
WRAPPED = ("broadcast", "broadcast_coalesced", "scatter", "gather")


def install():
    from torch.nn.parallel import comm

    for name in WRAPPED:
        original = getattr(comm, name)
        if getattr(original, "_flagos", False):
            continue
        setattr(comm, name, _on_flagos_accelerator(original, globals()[name]))


def _on_flagos_accelerator(original, ours):
    def call(*args, **kwargs):
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is not None and accelerator.type == BACKEND:
            return ours(*args, **kwargs)
        return original(*args, **kwargs)

    call._flagos = True
    call.__wrapped__ = original
    call.__doc__ = original.__doc__
    call.__name__ = original.__name__
    return call


def _device(index):
    """A device argument of comm's functions (int, str or torch.device) as a flagos device."""
    from torch._utils import _get_device_index

    return torch.device(BACKEND, _get_device_index(index, optional=True))


def _to(tensor, device):
    # Preserve: a chunk keeps its strides where it can, as CUDA's scatter copies it.
    return tensor.to(device, non_blocking=True, memory_format=torch.preserve_format)


def broadcast(tensor, devices=None, *, out=None):
    if (devices is None) == (out is None):
        raise RuntimeError(
            f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}")
    if out is not None:
        for target in out:
            target.copy_(tensor, non_blocking=True)
        return tuple(out)
    return tuple(tensor if tensor.device == d else _to(tensor, d) for d in map(_device, devices))


def broadcast_coalesced(tensors, devices, buffer_size=10485760):
    devices = [_device(d) for d in devices]
    for t in tensors:
        if t.device != devices[0]:
            raise RuntimeError(
                f"broadcast_coalesced: all tensors must be on {devices[0]}, the first device, but one is on {t.device}")
    # The first device keeps the tensors themselves, as CUDA's does.
    return [list(tensors)] + [[_to(t, d) for t in tensors] for d in devices[1:]]


def scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
    if (devices is None) == (out is None):
        raise RuntimeError(
            f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}")
    if out is not None:
        if chunk_sizes is not None:
            raise RuntimeError(f"'chunk_sizes' must not be specified when 'out' is specified, but got {chunk_sizes}")
        chunks = tensor.split([o.size(dim) for o in out], dim)
        for i, (target, chunk) in enumerate(zip(out, chunks)):
            with _stream(streams, i):
                target.copy_(chunk, non_blocking=True)
        return tuple(out)
    devices = [_device(d) for d in devices]
    if chunk_sizes is None:
        chunks = tensor.chunk(len(devices), dim)
    else:
        if sum(chunk_sizes) != tensor.size(dim) or len(chunk_sizes) != len(devices):
            raise ValueError(f"scatter: chunk_sizes {list(chunk_sizes)} must give one size per device "
                             f"({len(devices)}) and sum to the tensor's size {tensor.size(dim)} in dim {dim}")
        chunks = tensor.split(list(chunk_sizes), dim)
    results = []
    for i, (chunk, device) in enumerate(zip(chunks, devices)):
        with _stream(streams, i):
            results.append(_to(chunk, device))
    return tuple(results)


def gather(tensors, dim=0, destination=None, *, out=None):
    if out is not None:
        if destination is not None:
            raise RuntimeError(
                f"'destination' must not be specified when 'out' is specified, but got destination={destination}")
        return torch.cat([t.to(out.device, non_blocking=True) for t in tensors], dim, out=out)
    if destination == -1 or (isinstance(destination, (str, torch.device)) and torch.device(destination).type == "cpu"):
        target = torch.device("cpu")
    else:
        target = _device(destination)
    return torch.cat([t.to(target, non_blocking=True) for t in tensors], dim)


def _stream(streams, i):
    """The copy's stream where the caller gave one (DataParallel does, for
    copies from the CPU), else the current one."""
    import contextlib

    if streams is None or streams[i] is None:
        return contextlib.nullcontext()
    return torch.flagos.stream(streams[i])
