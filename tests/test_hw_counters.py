"""benchmarks/hw_counters.py: the perf_event_open wrapper, checked with the
kernel's software events (they open in VMs too, where the CPU's own counters
usually do not)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import hw_counters  # noqa: E402

# PERF_TYPE_SOFTWARE (1): task clock in ns (1), page faults (2).
SOFTWARE = (("task clock", 1, 1), ("page faults", 1, 2))


def software_counters():
    counters = hw_counters.HardwareCounters(events=SOFTWARE)
    if not counters.available:
        pytest.skip(f"perf_event_open refused even software events here: {counters.why_not}")
    return counters


def test_counts_the_work_between_two_reads():
    counters = software_counters()
    try:
        before = counters.read()
        pages = bytearray(64 << 20)  # touching new memory faults pages in and takes time
        for i in range(0, len(pages), 4096):
            pages[i] = 1
        spent = hw_counters.HardwareCounters.delta(before, counters.read())
    finally:
        counters.close()
    assert counters.read() == {} and not counters.available  # closed: nothing left open
    assert spent["page faults"] >= 1000  # at least a quarter of the 16384 pages (huge pages fault fewer)
    assert spent["task clock"] > 0


def test_an_event_the_kernel_does_not_know_is_reported_not_raised():
    # A hardware event with a config far past the generic ones: no PMU takes it.
    counters = hw_counters.HardwareCounters(events=(("no such event", 0, 0xFFFF),))
    assert not counters.available
    assert counters.why_not.startswith("no such event: ")
    assert counters.read() == {}


def test_the_events_that_open_are_the_ones_read():
    counters = hw_counters.HardwareCounters(events=SOFTWARE + (("no such event", 0, 0xFFFF),))
    try:
        if not counters.available:
            pytest.skip(f"perf_event_open refused even software events here: {counters.why_not}")
        assert counters.names == ["task clock", "page faults"]
        assert set(counters.read()) == {"task clock", "page faults"}
    finally:
        counters.close()
