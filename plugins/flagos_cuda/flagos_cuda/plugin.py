"""flagos hooks of the CUDA plugin. Importing this module loads no compiled
code: the core checks the build facts first."""

import importlib

import torch

import os

from flagos_core.hookspecs import PluginInfo, ProviderSpec, RuntimeSpec, hookimpl

from . import __version__

NAME = "flagos-cuda"


def _build_info():
    try:
        return importlib.import_module("flagos_cuda._build_info")
    except ImportError:
        return None


@hookimpl
def flagos_plugin_info():
    info = _build_info()
    return PluginInfo(
        name=NAME, version=__version__,
        abi_version=getattr(info, "ABI_VERSION", -1), torch_version=getattr(info, "TORCH_VERSION", "unbuilt"))


_active = False


def _activate():
    global _active
    torch.cuda.init()  # CUDA's allocator and generators exist from here on
    from . import _C

    _C.activate()
    _active = True


@hookimpl
def flagos_runtimes():
    return [RuntimeSpec(name="cuda", priority=100, is_available=torch.cuda.is_available, activate=_activate)]


def _register_flash():
    from . import _C

    _C.register_flash_provider()


@hookimpl
def flagos_providers():
    if not _active:
        return []
    return [ProviderSpec(name="cuda_flash", register=_register_flash)]


@hookimpl
def flagos_confs():
    if not _active:
        return []
    return [os.path.join(os.path.dirname(os.path.abspath(__file__)), "confs", "cuda.yaml")]


@hookimpl
def flagos_extend_device_module(module, runtime):
    if runtime != "cuda":
        return
    import flagos_core

    from . import graphs, jiterator, memory, recurrent

    # flagos runs CUDA's kernels, so torch.autocast("flagos") casts by CUDA's
    # policy lists: the same dtypes, the same kernels, the same results.
    flagos_core.use_autocast_policies("cuda")
    jiterator.install()
    recurrent.install()  # flatten_parameters() packs flagos weights for cuDNN too
    module.CUDAGraph = graphs.CUDAGraph
    module.graph = graphs.graph
    module.graph_pool_handle = graphs.graph_pool_handle
    module.make_graphed_callables = torch.cuda.make_graphed_callables
    memory.install(module)
    module.is_bf16_supported = torch.cuda.is_bf16_supported
    module.is_current_stream_capturing = torch.cuda.is_current_stream_capturing
