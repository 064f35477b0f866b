"""Where each ATen overload runs: query and steer the router."""

import collections.abc
import contextlib

from . import _C, _conf


def providers():
    """Names of the kernel providers that are live."""
    return list(_C._providers())


def route(overload):
    """Name of the provider that serves `overload` (e.g. "add.Tensor", or
    torch.ops.aten.add.Tensor) now."""
    return _C._route(_overload_name(overload))


def route_layer(overload):
    """Which layer chose the route of `overload` ("default", "api", ...)."""
    return _C._route_layer(_overload_name(overload))


def _overload_name(overload):
    # A name ("add.Tensor", "aten::add.Tensor") or torch.ops.aten.add.Tensor.
    schema = getattr(overload, "_schema", None)
    if schema is not None:
        return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    if not isinstance(overload, str):
        raise TypeError(f"flagos: an overload is named by a string such as 'add.Tensor' (or given as "
                        f"torch.ops.aten.add.Tensor), not {type(overload).__name__}")
    return overload


def set_route(overload, provider):
    """Route `overload` to `provider` from now on (the runtime API layer)."""
    if not isinstance(provider, str):
        raise TypeError(f"flagos: a provider is named by a string (flagos_core.providers() lists them), "
                        f"not {type(provider).__name__}")
    _C._set_route(_overload_name(overload), provider, "api")


def clear_route(overload):
    """Drop a runtime route; the overload goes back to the route a conf or
    the environment gave it, else to its default."""
    name = _conf._canonical(_overload_name(overload))
    below = _conf.beneath.get(name)
    if below is not None:
        _C._set_route(name, *below)
    else:
        _C._clear_route(name)


def set_whole_ops(enabled):
    """Switch on (the default) or off running composite ops such as linear
    whole on the native device where no autograd is needed (one routed call
    instead of one per op of their decomposition; FLAGOS_WHOLE_OPS=0 at
    import switches it off)."""
    if not isinstance(enabled, bool):  # bool("0") is True
        raise TypeError(f"flagos: set_whole_ops takes True or False, not {enabled!r}")
    _C._set_whole_ops(enabled)


def whole_ops():
    """Whether composite ops run whole now: the switch is on, and no route
    sends an overload the native device can run to another provider (a
    whole call would bypass it)."""
    return bool(_C._whole_ops_on())


@contextlib.contextmanager
def routes(mapping):
    """Route several overloads for the duration of a `with` block; each goes
    back to the route it had before (an API route, a conf's, its default)."""
    if not isinstance(mapping, collections.abc.Mapping):
        raise TypeError(f"flagos: routes() takes a mapping {{overload: provider}}, not {type(mapping).__name__}")
    previous = []
    try:
        for overload, provider in mapping.items():
            name = _overload_name(overload)
            before = (_C._route(name), _C._route_layer(name))
            set_route(name, provider)
            previous.append((name, before))
        yield
    finally:
        for name, (provider, layer) in reversed(previous):
            if layer == "api":
                _C._set_route(name, provider, "api")
            else:
                clear_route(name)
