"""nn.DataParallel (and torch.nn.parallel's replicate, scatter, gather) on
flagos devices with a CPU build of torch.

DataParallel works on the current accelerator's devices, which with a CPU
build of torch are flagos's. Its copies between devices go through
torch.nn.parallel.comm, whose Python (device indices, complex tensors as
real views, argument checks) ends in CUDA's C++ functions torch._C._scatter
and the like: a CPU build has none, and a DataParallel model failed there
with an AttributeError from torch's internals, on one flagos device as on
several. Here those functions are ordinary tensor ops, with what CUDA's
return: a device's own tensor (or chunk) as it is, a copy for every other
device, device indices meaning the accelerator's devices. With a CUDA build
they exist and stay torch's (DataParallel then runs on CUDA devices).
"""

import contextlib
import functools
import importlib

import torch

BACKEND = "flagos"
# torch._C's names for comm.py, and what serves each here.
FUNCTIONS = {
    "_broadcast": "broadcast",
    "_broadcast_out": "broadcast_out",
    "_broadcast_coalesced": "broadcast_coalesced",
    "_scatter": "scatter",
    "_scatter_out": "scatter_out",
    "_gather": "gather",
    "_gather_out": "gather_out",
}


def install():
    if hasattr(torch._C, "_scatter"):  # a CUDA build: torch's own
        return
    for name, ours in FUNCTIONS.items():
        setattr(torch._C, name, globals()[ours])
    # DataParallel calls parallel_apply by the name it imported; the package
    # exports the function under its module's name.
    module = importlib.import_module("torch.nn.parallel.parallel_apply")
    carried = _carrying_autocast(module.parallel_apply)
    for namespace in (module, importlib.import_module("torch.nn.parallel.data_parallel"), torch.nn.parallel):
        namespace.parallel_apply = carried


class _UnderAutocast:
    """A replica called under the caller's flagos autocast."""

    def __init__(self, module, dtype, cache_enabled):
        self.module, self.dtype, self.cache_enabled = module, dtype, cache_enabled

    def __call__(self, *args, **kwargs):
        with torch.autocast(BACKEND, dtype=self.dtype, cache_enabled=self.cache_enabled):
            return self.module(*args, **kwargs)


def _carrying_autocast(parallel_apply):
    # torch's parallel_apply runs each replica under
    # autocast(<accelerator>, enabled=torch.is_autocast_enabled()), and that
    # flag is CUDA's: for flagos's devices the replicas ran without the
    # caller's autocast (float32 where CUDA's DataParallel gives bfloat16).
    # Here each replica enters the caller's flagos autocast, with its dtype
    # (a thread's own default would be float16), inside torch's.
    @functools.wraps(parallel_apply)
    def carrying(modules, inputs, kwargs_tup=None, devices=None):
        if torch.is_autocast_enabled(BACKEND):
            dtype, cache = torch.get_autocast_dtype(BACKEND), torch.is_autocast_cache_enabled()
            modules = [_UnderAutocast(m, dtype, cache) for m in modules]
        return parallel_apply(modules, inputs, kwargs_tup, devices)

    return carrying


def _device(index):
    return torch.device(BACKEND, index)


def _to(tensor, device):
    # Preserve: a chunk keeps its strides where it can, as CUDA's copies do.
    return tensor.to(device, non_blocking=True, memory_format=torch.preserve_format)


def _check_out(tensor, out, same_size_except=None):
    for i, target in enumerate(out):
        sizes = list(target.shape)
        expected = list(tensor.shape)
        if same_size_except is not None:
            sizes.pop(same_size_except)
            expected.pop(same_size_except)
        if sizes != expected:
            raise RuntimeError(f"Output tensor at index {i} has a shape {tuple(target.shape)} that does not match "
                               f"the input's {tuple(tensor.shape)}" + ("" if same_size_except is None else
                                                                          f" outside dim {same_size_except}"))


def broadcast(tensor, devices):
    return [tensor if tensor.device == _device(d) else _to(tensor, _device(d)) for d in devices]


def broadcast_out(tensor, out):
    _check_out(tensor, out)
    for target in out:
        target.copy_(tensor, non_blocking=True)
    return list(out)


def broadcast_coalesced(tensors, devices, buffer_size):
    first = _device(devices[0])
    for t in tensors:
        if t.device != first:
            raise RuntimeError(f"All tensors must be on devices[0]: {first}, but one is on {t.device}")
    # The first device keeps the tensors themselves, as CUDA's does.
    return [list(tensors)] + [[_to(t, _device(d)) for t in tensors] for d in devices[1:]]


def scatter(tensor, devices, chunk_sizes, dim, streams):
    if not devices:
        raise RuntimeError("Expected at least one device to scatter to")
    if chunk_sizes is not None and len(chunk_sizes) != len(devices):
        raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, but got len(devices) = "
                           f"{len(devices)} and len(chunk_sizes) = {len(chunk_sizes)}")
    chunks = list(tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None else tensor.chunk(len(devices), dim))
    for i, chunk in enumerate(chunks):
        device = _device(devices[i])
        if chunk.device != device:  # a device's own chunk stays a view, as CUDA's
            with _stream(streams, i, device):
                chunks[i] = _to(chunk, device)
    return chunks


def scatter_out(tensor, out, dim, streams):
    dim = dim % max(tensor.dim(), 1)
    _check_out(tensor, out, same_size_except=dim)
    total = sum(target.size(dim) for target in out)
    if total != tensor.size(dim):
        raise RuntimeError(f"Total size for output tensors along scatter dim {dim} does not match the input's "
                           f"({total} against {tensor.size(dim)})")
    for i, (target, chunk) in enumerate(zip(out, tensor.split([t.size(dim) for t in out], dim))):
        with _stream(streams, i, target.device):
            target.copy_(chunk, non_blocking=True)
    return list(out)


def gather(tensors, dim, destination_index):
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    if destination_index == -1:
        target = torch.device("cpu")
    elif destination_index is None:
        target = _device(torch.flagos.current_device())
    else:
        target = _device(destination_index)
    return torch.cat([t.to(target, non_blocking=True) for t in tensors], dim)


def gather_out(tensors, out, dim):
    return torch.cat([t.to(out.device, non_blocking=True) for t in tensors], dim, out=out)


def _stream(streams, i, device):
    """The copy's stream where the caller gave one (DataParallel does, for
    copies from the CPU), else the current one."""
    if streams is None or streams[i] is None:
        return contextlib.nullcontext()
    stream = streams[i]
    if stream.device != device:
        raise RuntimeError(f"Expected the device associated with the stream at index {i} (was {stream.device}) "
                           f"to match the device supplied at that index (expected {device})")
    return torch.flagos.stream(stream)
