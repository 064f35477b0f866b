"""Which matrix-product calls cost flagos more host time than the native device.

    python benchmarks/bench_mm_paths.py [--calls N] [--rounds N]

A diagnostic next to bench_host_overhead.py. On the H200 (2026-12-03) flagos
added about 6 us to a decode-shaped bf16 `linear` while a 64x64 float32 `mm`
gained under 2 us and elementwise ops about 0.5 us. This times the steps
between those two cases one at a time (dtype, shape, a transposed weight
made like a model parameter, `linear`'s decomposition), interleaved native
and flagos blocks, and prints the extra microseconds per call: the first
row where the extra jumps names the cause.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_host_overhead import load_demo, time_calls  # noqa: E402


def cases(device):
    """[(name, zero-argument callable)] on `device`, in the order they are reported."""
    def made(*shape, dtype):  # as a model's parameters are made: on the host, then moved
        return torch.randn(*shape, dtype=dtype).to(device)

    f32, bf16 = torch.float32, torch.bfloat16
    s32, s16 = made(64, 64, dtype=f32), made(64, 64, dtype=bf16)
    row32, row16 = made(1, 1024, dtype=f32), made(1, 1024, dtype=bf16)
    wide32, wide16 = made(1024, 3072, dtype=f32), made(1024, 3072, dtype=bf16)
    weight16 = made(3072, 1024, dtype=bf16)
    weight16_t = weight16.t()
    token16 = made(1, 1, 1024, dtype=bf16)
    out16 = made(1, 3072, dtype=bf16)
    return [
        ("add bf16 1x3072 (elementwise control)", lambda: torch.add(out16, out16)),
        ("mm f32 64x64", lambda: torch.mm(s32, s32)),
        ("mm bf16 64x64", lambda: torch.mm(s16, s16)),
        ("mm f32 1x1024 @ 1024x3072", lambda: torch.mm(row32, wide32)),
        ("mm bf16 1x1024 @ 1024x3072", lambda: torch.mm(row16, wide16)),
        ("mm bf16 1x1024 @ weight.t() (view made once)", lambda: torch.mm(row16, weight16_t)),
        ("mm bf16 1x1024 @ weight.t() (t() per call)", lambda: torch.mm(row16, weight16.t())),
        ("linear bf16 1x1x1024, weight 3072x1024", lambda: F.linear(token16, weight16)),
    ]


def profile_events(fn, device, calls, synchronize):
    """{event name: (count per call, self CPU us per call)} of `calls` calls:
    ATen ops and the CUDA runtime calls (cudaLaunchKernel, ...) they make."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        synchronize(device)
    return {
        e.key: (e.count / calls, e.self_cpu_time_total / calls)
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0 or e.count >= calls
    }


def print_profile(name, native_fn, flagos_fn, native, flagos, calls, synchronize):
    """Side by side, the events one call makes on each device."""
    n = profile_events(native_fn, native, calls, synchronize)
    f = profile_events(flagos_fn, flagos, calls, synchronize)
    print(f"\nprofile of '{name}', per call ({calls} calls): count and self CPU us")
    print(f"{'event':44s} {'native n':>8s} {'us':>7s} {'flagos n':>8s} {'us':>7s}")
    for key in sorted(set(n) | set(f), key=lambda k: -f.get(k, n.get(k))[1]):
        nc, nt = n.get(key, (0, 0.0))
        fc, ft = f.get(key, (0, 0.0))
        print(f"{key[:44]:44s} {nc:8.2f} {nt:7.2f} {fc:8.2f} {ft:7.2f}")


def per_call_us(fn, device, calls, synchronize):
    return time_calls(fn, device, calls, synchronize, time.perf_counter) * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--profile", default="mm f32 64x64,linear bf16",
                        help="comma-separated case-name prefixes to profile after timing ('' for none)")
    args = parser.parse_args(argv)
    demo = load_demo()
    native, flagos = demo.native_device_for(demo.flagos_runtime_name()), torch.device("flagos")
    sides = (cases(native), cases(flagos))
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  torch {torch.__version__}  native {native}; "
          f"{args.rounds} interleaved rounds x {args.calls} calls, medians, wall clock")
    print(f"{'case':48s} {'native us':>10s} {'flagos us':>10s} {'extra us':>9s} {'ratio':>6s}")
    for (name, native_fn), (_, flagos_fn) in zip(*sides):
        pair = ((native, native_fn), (flagos, flagos_fn))
        for device, fn in pair:  # warm-up: cuBLAS handles, heuristics, caches
            per_call_us(fn, device, args.calls // 4, demo.synchronize)
        samples = ([], [])
        for r in range(args.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for i in order:
                samples[i].append(per_call_us(pair[i][1], pair[i][0], args.calls, demo.synchronize))
        n, f = statistics.median(samples[0]), statistics.median(samples[1])
        print(f"{name:48s} {n:10.2f} {f:10.2f} {f - n:9.2f} {f / n:6.3f}")
    prefixes = [p for p in args.profile.split(",") if p]
    for (name, native_fn), (_, flagos_fn) in zip(*sides):
        if any(name.startswith(p) for p in prefixes):
            print_profile(name, native_fn, flagos_fn, native, flagos, 200, demo.synchronize)
    return 0


if __name__ == "__main__":
    sys.exit(main())
