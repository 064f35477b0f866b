"""flagos-core: the `flagos` PyTorch device.

Importing this package (torch's backend autoload does it for a plain
`import torch`) renames PrivateUse1 to `flagos`, activates a device runtime
and installs `torch.flagos`.
"""

import os as _os


def _autoload():
    """Entry point of torch's `torch.backends` group: importing is the setup.

    Defined before `import torch`, which may re-enter this module through
    that very entry point when flagos_core is imported first."""


import torch as _torch  # noqa: E402

from . import _C  # noqa: E402
from ._routing import route, route_layer, set_route, clear_route, routes, providers
from ._trace import trace

__version__ = "0.1.0"
__all__ = [
    "runtime", "plugins", "providers", "route", "route_layer", "set_route", "clear_route", "routes", "trace",
]

_BACKEND = "flagos"


def _host_device_count():
    value = _os.environ.get("FLAGOS_HOST_DEVICES", "1")
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"FLAGOS_HOST_DEVICES must be a whole number of devices (1 to 64), got {value!r}") from None
    if not 1 <= count <= 64:
        raise ValueError(f"FLAGOS_HOST_DEVICES must be between 1 and 64, got {count}")
    return count


def _setup():
    if not _C._has_runtime():
        _C._activate_host_runtime(_host_device_count())
    if _torch._C._get_privateuse1_backend_name() != _BACKEND:
        _torch.utils.rename_privateuse1_backend(_BACKEND)
    from . import _device_module

    _torch._register_device_module(_BACKEND, _device_module)
    _torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)


def runtime():
    """The active device runtime: name, plugin, version, device count."""
    name = _C._runtime_name()
    return {
        "name": name,
        "plugin": "flagos-core" if name == "host" else name,
        "version": __version__,
        "device_count": _C._device_count(),
    }


def plugins():
    """Discovered plugins. The host runtime is built in; no plugin is loaded yet."""
    return []


_setup()
