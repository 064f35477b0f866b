"""flagos-core: the `flagos` PyTorch device.

Importing this package (torch's backend autoload does it for a plain
`import torch`) renames PrivateUse1 to `flagos`, activates a device runtime
and installs `torch.flagos`.
"""

import collections.abc as _collections_abc
import os as _os
import sys as _sys


def _autoload():
    """Entry point of torch's `torch.backends` group: importing is the setup.

    Defined before `import torch`, which may re-enter this module through
    that very entry point when flagos_core is imported first."""


import torch as _torch  # noqa: E402

from . import _C  # noqa: E402
from ._routing import route, route_layer, set_route, clear_route, routes, providers, set_whole_ops, whole_ops
from ._trace import trace
from . import _plugins  # noqa: E402
from . import _conf  # noqa: E402
from . import _native_backward  # noqa: E402
from . import _distributed  # noqa: E402
from . import _multiprocessing  # noqa: E402
from . import _inductor  # noqa: E402
from . import _data_parallel  # noqa: E402
from . import _dlpack  # noqa: E402
from . import _python_choices  # noqa: E402
from ._conf import ConfError, load_conf  # noqa: E402

__version__ = "0.1.4"
__all__ = [
    "runtime", "plugins", "providers", "route", "route_layer", "set_route", "clear_route", "routes", "trace",
    "set_whole_ops", "whole_ops",
    "ConfError", "load_conf", "register_python_provider", "as_native", "from_native", "use_autocast_policies",
    "cmake_prefix_path",
]

_BACKEND = "flagos"


def _setup():
    global _PLUGINS
    backtrace = _os.environ.get("FLAGOS_NATIVE_BACKTRACE", "0")
    if backtrace != "0":  # native stack of a crash: "1" on stderr, else the file named
        _C._install_crash_backtrace("" if backtrace == "1" else backtrace)
    _PLUGINS = _plugins.Plugins()
    _PLUGINS.discover()
    if not _C._has_runtime():
        _PLUGINS.activate()
    if _torch._C._get_privateuse1_backend_name() != _BACKEND:
        _torch.utils.rename_privateuse1_backend(_BACKEND)
    from . import _amp, _device_module, _legacy_types

    _torch._register_device_module(_BACKEND, _device_module)
    _device_module.amp = _amp  # torch.flagos.amp, as torch.cuda.amp
    _sys.modules[f"torch.{_BACKEND}.amp"] = _amp
    _legacy_types.install(_device_module)  # torch.flagos.FloatTensor, ..., as torch.cuda's
    _PLUGINS.extend_device_module(_device_module, _C._runtime_name())
    _torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    _let_autograd_threads_finish_at_exit()
    _native_backward.install()  # a clear error where PyTorch's engine cannot run a native backward
    _distributed.install()  # collectives on flagos tensors through the native device's backend
    _multiprocessing.install()  # flagos tensors shared through torch.multiprocessing
    _inductor.install()  # torch.compile's inductor compiles flagos graphs for the native device
    _data_parallel.install()  # nn.DataParallel's copies between flagos devices
    _dlpack.install()  # DLPack exports flagos tensors as the native device's memory
    _python_choices.install()  # torch's Python picks by device type: the native device's pick
    _conf.configure(_PLUGINS.confs(), _PLUGINS.refuse_conf)  # routing confs and FLAGOS_LOG_DISPATCH; raises ConfError


def _let_autograd_threads_finish_at_exit():
    """flagos has autograd device threads (CPU-only torch has none). If one
    drops its last reference to a finished backward while Python is shutting
    down, torch's thread aborts the process. A moment's pause at exit lets
    those threads finish first."""
    import atexit
    import time

    atexit.register(time.sleep, 0.05)


def runtime():
    """The active device runtime: name, plugin, version, device count."""
    name = _C._runtime_name()
    owner = next((p for p in _PLUGINS.statuses if p.runtime == name), None)
    return {
        "name": name,
        "plugin": owner.name if owner else "?",
        "version": owner.version if owner else "?",
        "device_count": _C._device_count(),
    }


def plugins():
    """Discovered plugins: name, version, loaded, and why one was refused."""
    return [p.as_dict() for p in _PLUGINS.statuses]


def register_python_provider(name, kernels):
    """Registers a provider whose kernels are Python callables by overload
    name ({"add.Tensor": fn, ...}); names and kernels are checked first."""
    if not isinstance(name, str):
        raise TypeError(f"flagos: a provider is named by a string, got {type(name).__name__} {name!r}")
    if not name:
        raise ValueError("flagos: a provider needs a non-empty name")
    if not isinstance(kernels, _collections_abc.Mapping):
        raise TypeError(f"flagos: provider {name!r}: kernels are a mapping {{overload name: callable}}, not "
                        f"{type(kernels).__name__}")
    kernels = dict(kernels)
    seen = {}  # overload without its aten:: prefix -> the key that named it
    for overload, kernel in kernels.items():
        if not isinstance(overload, str):
            raise TypeError(f"flagos: provider {name!r}: an overload is named by a string such as 'add.Tensor', "
                            f"got {overload!r}")
        plain = overload.removeprefix("aten::")
        if plain in seen:  # one would be dropped silently
            raise ValueError(f"flagos: provider {name!r}: {overload!r} and {seen[plain]!r} name one overload")
        seen[plain] = overload
        # Known to the dispatcher? (Without resolving the overload's route,
        # which would settle it before this provider exists.)
        qualified = overload if "::" in overload else f"aten::{overload}"
        op, _, overload_name = qualified.partition(".")
        try:
            _torch._C._dispatch_find_schema_or_throw(op, overload_name)
        except RuntimeError:
            raise ValueError(f"flagos: provider {name!r}: unknown operator overload {overload!r}") from None
        if not callable(kernel):
            raise TypeError(f"flagos: provider {name!r}: the kernel for {overload} must be callable, got "
                            f"{type(kernel).__name__}")
    _C._register_python_provider(name, kernels)


def as_native(tensor):
    """The flagos tensor's memory as a tensor of the runtime's native device (no copy)."""
    return _C._to_native(tensor)


def from_native(tensor, index=None):
    """A native-device tensor's memory as a flagos tensor (no copy)."""
    return _C._from_native(tensor, _C._current_device() if index is None else index)


def use_autocast_policies(device):
    """For a plugin whose runtime runs `device`'s kernels (the CUDA plugin:
    "cuda"; the host runtime itself: "cpu"): torch.autocast("flagos") then
    casts as torch.autocast(device) does, with the same policy lists, so
    results stay the native device's. Once per process. Without it, autocast
    on flagos is off (torch.autocast says so and turns itself off)."""
    _C._use_autocast_policies(device)


def cmake_prefix_path():
    """Folder holding flagos_coreConfig.cmake, for plugins built against this core."""
    return _os.path.join(_os.path.dirname(_C.__file__), "share", "cmake")


_setup()
