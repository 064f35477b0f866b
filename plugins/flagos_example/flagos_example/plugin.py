"""flagos hooks of the example plugin.

flagos-core imports this module (the entry point names it) and calls its
hooks. Importing it must stay cheap and must not load compiled code: the
core first reads flagos_plugin_info to check that _C was built for this
core's plugin ABI and this torch, and refuses the plugin otherwise. _C is
imported inside ProviderSpec.register, which the core calls only after it
has accepted the plugin.
"""

import importlib
import os

from flagos_core.hookspecs import PluginInfo, ProviderSpec, hookimpl

from . import __version__

NAME = "flagos-example"
HERE = os.path.dirname(os.path.abspath(__file__))


def _build_info():
    """The facts CMake wrote at build time (flagos_plugin_build_info)."""
    try:
        return importlib.import_module("flagos_example._build_info")
    except ImportError:
        return None


@hookimpl
def flagos_plugin_info():
    info = _build_info()
    if info is None:  # a source checkout that was never built: refuse it
        return PluginInfo(NAME, __version__, abi_version=-1, torch_version="none (not built)")
    return PluginInfo(NAME, __version__, abi_version=info.ABI_VERSION, torch_version=info.TORCH_VERSION)


def _register_cpp():
    from . import _C  # compiled code: only now, after the core's checks

    _C.register_example_provider()


def _register_py():
    from . import python_provider

    python_provider.register()


@hookimpl
def flagos_providers():
    return [
        ProviderSpec(name="example_cpp", register=_register_cpp),
        ProviderSpec(name="example_py", register=_register_py),
    ]


@hookimpl
def flagos_confs():
    return [os.path.join(HERE, "confs", "example.yaml")]
