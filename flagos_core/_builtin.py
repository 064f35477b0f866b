"""The core's own plugin: the host runtime and the host / cpu_fallback /
composite providers, registered through the same hooks as any other plugin."""

import os

from . import _C
from .hookspecs import PluginInfo, ProviderSpec, RuntimeSpec, hookimpl

NAME = "flagos-core"


def _host_device_count():
    value = os.environ.get("FLAGOS_HOST_DEVICES", "1")
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"FLAGOS_HOST_DEVICES must be a whole number of devices (1 to 64), got {value!r}") from None
    if not 1 <= count <= 64:
        raise ValueError(f"FLAGOS_HOST_DEVICES must be between 1 and 64, got {count}")
    return count


@hookimpl
def flagos_plugin_info():
    from . import __version__

    return PluginInfo(name=NAME, version=__version__)


@hookimpl
def flagos_runtimes():
    return [RuntimeSpec(name="host", priority=0, is_available=lambda: True, activate=_activate_host_runtime)]


def _activate_host_runtime():
    from . import _host_norms, _host_optimizers, _host_rnn

    _C._activate_host_runtime(_host_device_count())
    _host_rnn.register()
    _host_norms.register()
    _host_optimizers.install()
    # The host runtime runs CPU's kernels: torch.autocast("flagos") casts as
    # torch.autocast("cpu") does, so results stay CPU's.
    _C._use_autocast_policies("cpu")


@hookimpl
def flagos_providers():
    # `host` is registered by the host runtime itself: it only makes sense on
    # host memory.
    from . import _composite

    return [ProviderSpec(name="cpu_fallback", register=_C._register_cpu_fallback),
            ProviderSpec(name=_composite.NAME, register=_composite.register)]
