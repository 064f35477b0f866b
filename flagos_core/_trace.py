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
    """Counts the calls made while the block runs, in every thread. Inside
    another trace, the counts are this block's own: the process keeps one
    set of counters, so the counts at entry are taken off at exit."""
    t = Trace()
    start = _C._trace_begin()  # empty for the first trace open, which starts the counters from zero
    try:
        yield t
    finally:
        end = _C._trace_end()
        t.counts = {key: n - start.get(key, 0) for key, n in end.items() if n != start.get(key, 0)}
