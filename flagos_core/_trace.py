"""`with flagos_core.trace() as t:` counts which provider served each overload."""

import contextlib

from . import _C

FALLBACK_PROVIDER = "cpu_fallback"


class Trace:
    def __init__(self):
        self.counts = {}

    @property
    def fallbacks(self):
        """Overloads that went through cpu_fallback, sorted."""
        return sorted({op for (op, provider) in self.counts if provider == FALLBACK_PROVIDER})

    def by_provider(self):
        """Calls per provider."""
        totals = {}
        for (_, provider), calls in self.counts.items():
            totals[provider] = totals.get(provider, 0) + calls
        return totals


@contextlib.contextmanager
def trace():
    t = Trace()
    _C._trace_begin()
    try:
        yield t
    finally:
        t.counts = dict(_C._trace_end())
