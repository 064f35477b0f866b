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
