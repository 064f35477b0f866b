"""The plugin contract: pluggy hook specifications.

A plugin is a module named by an entry point in the group `flagos.plugins`.
Importing that module must be cheap and safe: it must not load compiled code,
because the core first reads `flagos_plugin_info` to check that the plugin was
built for this core's plugin ABI and this torch, and refuses it otherwise.
Compiled code is loaded from `RuntimeSpec.activate` or `ProviderSpec.register`.
"""

import dataclasses
from typing import Callable, List, Optional

import pluggy

PROJECT = "flagos"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    name: str
    version: str
    # The core plugin ABI the plugin's compiled code was built for
    # (flagos_core._C.PLUGIN_ABI_VERSION at its build), and torch.__version__
    # of the torch it was compiled against. None: pure Python, nothing to check.
    abi_version: Optional[int] = None
    torch_version: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class RuntimeSpec:
    name: str
    # Among available runtimes the highest priority wins (host: 0).
    priority: int
    # Whether the hardware is present. Must not load the runtime.
    is_available: Callable[[], bool]
    # Loads the compiled runtime and makes it the process's runtime.
    activate: Callable[[], None]


@dataclasses.dataclass(frozen=True)
class ProviderSpec:
    name: str
    # Registers the provider with the router (called once, after the runtime
    # is active). Python providers call flagos_core.register_python_provider.
    register: Callable[[], None]


@hookspec
def flagos_plugin_info() -> PluginInfo:
    """Name, version and build facts of the plugin."""


@hookspec
def flagos_runtimes() -> List[RuntimeSpec]:
    """Device runtimes the plugin can provide."""


@hookspec
def flagos_providers() -> List[ProviderSpec]:
    """Kernel providers the plugin contributes."""


@hookspec
def flagos_confs() -> List[str]:
    """Paths of routing confs the plugin ships (YAML or .conf)."""


@hookspec
def flagos_extend_device_module(module, runtime: str) -> None:
    """Add names to `torch.flagos` (e.g. CUDA graphs) once `runtime` is active."""
