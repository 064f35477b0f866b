"""Where each ATen overload runs: query and steer the router."""

import contextlib

from . import _C


def providers():
    """Names of the kernel providers that are live."""
    return list(_C._providers())


def route(overload):
    """Name of the provider that serves `overload` (e.g. "add.Tensor") now."""
    return _C._route(overload)


def route_layer(overload):
    """Which layer chose the route of `overload` ("default", "api", ...)."""
    return _C._route_layer(overload)


def set_route(overload, provider):
    """Route `overload` to `provider` from now on (the runtime API layer)."""
    _C._set_route(overload, provider, "api")


def clear_route(overload):
    """Drop a runtime route; the overload goes back to its default."""
    _C._clear_route(overload)


def set_whole_ops(enabled):
    """Switch on (the default) or off running composite ops such as linear
    whole on the native device where no autograd is needed (one routed call
    instead of one per op of their decomposition; FLAGOS_WHOLE_OPS=0 at
    import switches it off)."""
    _C._set_whole_ops(bool(enabled))


def whole_ops():
    """Whether composite ops run whole now: the switch is on, and no route
    sends an overload the native device can run to another provider (a
    whole call would bypass it)."""
    return bool(_C._whole_ops_on())


@contextlib.contextmanager
def routes(mapping):
    """Route several overloads for the duration of a `with` block."""
    applied = []
    try:
        for overload, provider in mapping.items():
            set_route(overload, provider)
            applied.append(overload)
        yield
    finally:
        for overload in applied:
            clear_route(overload)
