"""Where flagos spends more host time than the native device, op by op.

    python benchmarks/profile_ops.py [--model tiny|0.6b] [--tokens N] [--rounds N] [--top K] [--python]

Greedy-decodes with a Qwen3 on the native device and on flagos (same model,
same prompt, one process, the sides taking turns) under torch.profiler (CPU
activity: the host side of every ATen call), and prints the ops whose total
time grew most on flagos, per call and in all. Meant for the case where a
whole model is slower than the per-op benchmark predicts: the top rows say
which ops to look at.
With --python it also compares Python functions' own time (cProfile), for
gaps that lie between ATen calls (device checks, autocast, hooks).
"""

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import flagos_core

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_06b  # noqa: E402


def op_times(model, prompt, tokens, device):
    """{op name: (calls, total self CPU us)} over one greedy decode."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        qwen3_06b.greedy(model, prompt, tokens, device)
    return {e.key: (e.count, e.self_cpu_time_total) for e in prof.key_averages()}


def interleaved_op_times(models, prompt, tokens, rounds):
    """{device: {op: (calls, us)}} summed over `rounds` decodes per device,
    the devices taking turns (the first alternating), so that the machine's
    drift lands on both sides rather than on whichever ran second."""
    devices = list(models)
    for device in devices:  # warm-up: lazy init, caches
        qwen3_06b.greedy(models[device], prompt, 2, device)
    times = {device: {} for device in devices}
    for r in range(rounds):
        for device in (devices if r % 2 == 0 else devices[::-1]):
            for op, (calls, us) in op_times(models[device], prompt, tokens, device).items():
                c, t = times[device].get(op, (0, 0.0))
                times[device][op] = (c + calls, t + us)
    return times


def python_times(model, prompt, tokens, device):
    """{function: (calls, own seconds)} over one greedy decode, and its wall seconds."""
    qwen3_06b.greedy(model, prompt, 2, device)
    start = time.perf_counter()
    qwen3_06b.greedy(model, prompt, tokens, device)
    wall = time.perf_counter() - start
    prof = cProfile.Profile()
    prof.enable()
    qwen3_06b.greedy(model, prompt, tokens, device)
    prof.disable()
    stats = pstats.Stats(prof).stats
    named = {f"{os.path.basename(f)}:{line}:{fn}": (v[1], v[2]) for (f, line, fn), v in stats.items()}
    return named, wall


def print_diff(times, native, top, unit, scale):
    rows = []
    for name in set(times[native]) | set(times["flagos"]):
        n_calls, n_t = times[native].get(name, (0, 0.0))
        f_calls, f_t = times["flagos"].get(name, (0, 0.0))
        rows.append((f_t - n_t, name, n_calls, f_calls, n_t, f_t))
    rows.sort(reverse=True)
    print(f"{'name':60s} {'calls ' + native:>12s} {'calls flagos':>12s} {native + ' ' + unit:>12s} "
          f"{'flagos ' + unit:>12s} {'extra':>10s}")
    for extra, name, n_calls, f_calls, n_t, f_t in rows[:top]:
        print(f"{name[-60:]:60s} {n_calls:12d} {f_calls:12d} {n_t * scale:12.0f} {f_t * scale:12.0f} {extra * scale:10.0f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "0.6b"), default="tiny")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4, help="profiled decodes per device, interleaved")
    parser.add_argument("--python", action="store_true", help="also compare Python functions (cProfile)")
    args = parser.parse_args()
    native = "cuda" if flagos_core.runtime()["name"] == "cuda" else "cpu"
    sizes = qwen3_06b.TINY if args.model == "tiny" else {}
    dtype = torch.bfloat16 if native == "cuda" else torch.float32
    prompt = qwen3_06b.batches(1, batch=1, seq=8, vocab=sizes.get("vocab_size", 151936))[0]
    models = {device: qwen3_06b.build(device, dtype, **sizes).eval() for device in (native, "flagos")}
    times = interleaved_op_times(models, prompt, args.tokens, args.rounds)
    del models
    total_native = sum(us for _, us in times[native].values())
    total_flagos = sum(us for _, us in times["flagos"].values())
    print(f"host time in profiled ops: {native} {total_native / 1e3:.1f} ms, flagos {total_flagos / 1e3:.1f} ms "
          f"({args.model} Qwen3, {args.rounds} x {args.tokens} tokens per side, interleaved)")
    print_diff(times, native, args.top, "us", 1.0)
    if args.python:
        py_times, walls = {}, {}
        for device in (native, "flagos"):
            model = qwen3_06b.build(device, dtype, **sizes).eval()
            py_times[device], walls[device] = python_times(model, prompt, args.tokens, device)
            del model
        print(f"\nwall time per token without profiler: {native} {walls[native] / args.tokens * 1e3:.2f} ms, "
              f"flagos {walls['flagos'] / args.tokens * 1e3:.2f} ms")
        print("Python functions' own time (cProfile; builtins include the ATen calls they make):")
        print_diff(py_times, native, args.top, "us", 1e6)


if __name__ == "__main__":
    main()
