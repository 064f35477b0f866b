"""The CPU's own event counters (Linux perf_event_open) for the calling
thread, user space only, read around a piece of work.

    python benchmarks/hw_counters.py [--calls N]   # per call of each per-op benchmark op

    counters = HardwareCounters()      # the events this machine lets us open
    before = counters.read()
    work()
    spent = HardwareCounters.delta(before, counters.read())

Timing says that flagos's host path is slower in a model; these counts say
whether it executes more (instructions) or waits more on fetching its code
and data (instruction-cache and TLB misses), which decide different fixes.
On machines without a usable PMU (most VMs) no event opens: `available` is
False and `why_not` says why; callers print that instead of counts.
"""

import argparse
import ctypes
import os
import platform
import struct
import sys

# perf_event_open(2): types, and the generic events' numbers.
_TYPE_HARDWARE = 0
_TYPE_HW_CACHE = 3
_CACHE_L1D, _CACHE_L1I, _CACHE_LL, _CACHE_ITLB = 0, 1, 2, 4
_OP_READ = 0
_RESULT_MISS = 1


def _cache_miss(cache):
    return cache | (_OP_READ << 8) | (_RESULT_MISS << 16)


# (name, type, config), in the order printed.
EVENTS = (
    ("instructions", _TYPE_HARDWARE, 1),
    ("cycles", _TYPE_HARDWARE, 0),
    ("L1i misses", _TYPE_HW_CACHE, _cache_miss(_CACHE_L1I)),
    ("iTLB misses", _TYPE_HW_CACHE, _cache_miss(_CACHE_ITLB)),
    ("L1d misses", _TYPE_HW_CACHE, _cache_miss(_CACHE_L1D)),
    ("LLC misses", _TYPE_HW_CACHE, _cache_miss(_CACHE_LL)),
    ("branch misses", _TYPE_HARDWARE, 5),
)

_SYSCALL = {"x86_64": 298, "aarch64": 241}
_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7; the kernel accepts any known size
_READ_TIMES = 1 | 2  # TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING
_EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 5, 1 << 6


def _attr(event_type, config):
    buf = bytearray(_ATTR_SIZE)
    struct.pack_into("=IIQ", buf, 0, event_type, _ATTR_SIZE, config)
    struct.pack_into("=Q", buf, 32, _READ_TIMES)
    # Counting from the start (not disabled), this thread only (no
    # inherit), user space only: allowed at perf_event_paranoid 2.
    struct.pack_into("=Q", buf, 40, _EXCLUDE_KERNEL | _EXCLUDE_HV)
    return ctypes.create_string_buffer(bytes(buf), _ATTR_SIZE)


class HardwareCounters:
    def __init__(self, events=EVENTS):
        self.names, self._fds, failures = [], [], []
        number = _SYSCALL.get(platform.machine())
        if number is None:
            self.why_not = f"perf_event_open's number on {platform.machine()} is not known here"
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        for name, event_type, config in events:
            fd = libc.syscall(
                ctypes.c_long(number), _attr(event_type, config), ctypes.c_long(0), ctypes.c_long(-1),
                ctypes.c_long(-1), ctypes.c_ulong(0))
            if fd < 0:
                failures.append(f"{name}: {os.strerror(ctypes.get_errno())}")
                continue
            self.names.append(name)
            self._fds.append(fd)
        self.why_not = "; ".join(failures) if not self._fds else ""

    @property
    def available(self):
        return bool(self._fds)

    def read(self):
        """{event: count so far}, scaled up where the kernel multiplexed it."""
        out = {}
        for name, fd in zip(self.names, self._fds):
            value, enabled, running = struct.unpack("=QQQ", os.read(fd, 24))
            out[name] = value * enabled / running if running else 0.0
        return out

    @staticmethod
    def delta(before, after):
        return {name: after[name] - before[name] for name in after}

    def close(self):
        for fd in self._fds:
            os.close(fd)
        self.names, self._fds = [], []


def per_op_counts(calls):
    """{op: {device: {event: count per call}}} for bench_host_overhead's ops,
    each called `calls` times in a loop on the native device, then on flagos:
    the per-call cost with the op's code and data in the nearest caches, to
    hold against the same counts per call inside a model."""
    import torch

    from bench_host_overhead import load_demo, op_table

    demo = load_demo()
    native = demo.native_device_for(demo.flagos_runtime_name())
    counters = HardwareCounters()
    if not counters.available:
        return native, counters, {}
    gpu = native.type == "cuda"
    tables = {d: op_table(d, gpu) for d in (native, torch.device("flagos"))}
    out = {}
    for op in tables[native]:
        out[op] = {}
        for device, table in tables.items():
            fn = table[op]
            for _ in range(calls // 10 + 1):  # warm-up
                fn()
            demo.synchronize(device)
            before = counters.read()
            for _ in range(calls):
                fn()
            spent = HardwareCounters.delta(before, counters.read())
            demo.synchronize(device)
            out[op][device] = {name: n / calls for name, n in spent.items()}
    return native, counters, out


def main(argv=None):
    parser = argparse.ArgumentParser(description="CPU event counts per call of the per-op benchmark's ops")
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    native, counters, table = per_op_counts(args.calls)
    if not counters.available:
        print(f"CPU event counters: not available here ({counters.why_not})")
        return 0
    print(f"CPU event counts per call, {args.calls} calls in a loop per side (native {native}), flagos - native:")
    print(f"{'op':<16}" + "".join(f"{name:>15}" for name in counters.names))
    for op, sides in table.items():
        values = list(sides.values())
        print(f"{op:<16}" + "".join(f"{values[1][n] - values[0][n]:>+15,.0f}" for n in counters.names))
    print("native per call:")
    for op, sides in table.items():
        values = list(sides.values())
        print(f"{op:<16}" + "".join(f"{values[0][n]:>15,.0f}" for n in counters.names))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
