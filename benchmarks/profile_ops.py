"""Where flagos spends more host time than the native device, op by op.

    python benchmarks/profile_ops.py [--model tiny|0.6b] [--tokens N] [--rounds N] [--top K] [--kind aten|python|both]

Greedy-decodes with a Qwen3 on the native device and on flagos (same model,
same prompt, one process, the sides taking turns) and prints where flagos's
extra host time goes. Meant for the case where a whole model is slower than
the per-op benchmark predicts: the top rows say which calls to look at.

--kind aten (the default): torch.profiler's CPU activity, the host side of
every ATen call. A flagos call shows as two events, its own and the native
kernel's it reaches, so the profiler's own cost counts twice on flagos.
--kind python: cProfile, the sides alternating token by token. A builtin's
row (torch's Python bindings: `linear`, `to`, `cat`, ...) is the time of the
whole ATen call it makes, profiled at the same point on both sides, so its
"per call" column is the call's in-model cost beside the per-op benchmark's.
Also prints each side's wall and thread CPU time per token without a
profiler: extra wall time that is not CPU time is waiting, not work.
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
from bench_decode_steps import decode_round  # noqa: E402
from bench_host_overhead import load_demo  # noqa: E402


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
    for device in devices:  # warm-up: lazy init, caches, every cache length's kernel plans
        qwen3_06b.greedy(models[device], prompt, tokens, device)
    times = {device: {} for device in devices}
    for r in range(rounds):
        for device in (devices if r % 2 == 0 else devices[::-1]):
            for op, (calls, us) in op_times(models[device], prompt, tokens, device).items():
                c, t = times[device].get(op, (0, 0.0))
                times[device][op] = (c + calls, t + us)
    return times


def step_clocks(models, prompt, tokens, rounds):
    """{device: (wall s, thread CPU s)} per token, sides alternating per token,
    every step synchronised (the first round a warm-up). The warm-up decodes
    as many tokens as a timed round, as bench_decode_steps's does: a cache
    length seen for the first time may set up kernels (attention plans) on
    whichever side reaches it first, a cost both sides would share in the
    timed rounds, pulling the ratio towards 1. With a 2-token warm-up this
    read 0.982 and 0.983 on a GPU where bench_decode_steps read 0.957 to
    0.970 (docs/performance.md, twenty-third session)."""
    demo = load_demo()
    sums = {device: [0.0, 0.0] for device in models}

    def timed(decoder, device):
        demo.synchronize(device)
        wall, cpu = time.perf_counter(), time.thread_time()
        decoder.step()
        demo.synchronize(device)
        sums[device][0] += time.perf_counter() - wall
        sums[device][1] += time.thread_time() - cpu
        return 0.0

    decode_round(models, prompt, tokens, timed)
    sums = {device: [0.0, 0.0] for device in models}
    for _ in range(rounds):
        decode_round(models, prompt, tokens, timed)
    return {device: (w / (rounds * tokens), c / (rounds * tokens)) for device, (w, c) in sums.items()}


def python_times(models, prompt, tokens, rounds):
    """{device: {function: (calls, own seconds)}} under cProfile, the sides
    alternating token by token as in bench_decode_steps (prefill untimed)."""
    profilers = {device: cProfile.Profile() for device in models}

    def profiled(decoder, device):
        profilers[device].enable()
        decoder.step()
        profilers[device].disable()
        return 0.0

    for _ in range(rounds):
        decode_round(models, prompt, tokens, profiled)
    named = {}
    for device, prof in profilers.items():
        stats = pstats.Stats(prof).stats
        named[device] = {f"{os.path.basename(f)}:{line}:{fn}": (v[1], v[2]) for (f, line, fn), v in stats.items()}
    return named


def print_diff(times, native, top, unit, scale):
    rows = []
    for name in set(times[native]) | set(times["flagos"]):
        n_calls, n_t = times[native].get(name, (0, 0.0))
        f_calls, f_t = times["flagos"].get(name, (0, 0.0))
        rows.append((f_t - n_t, name, n_calls, f_calls, n_t, f_t))
    rows.sort(reverse=True)
    print(f"{'name':60s} {'calls ' + native:>12s} {'calls flagos':>12s} {native + ' ' + unit:>12s} "
          f"{'flagos ' + unit:>12s} {'extra':>10s} {'per call':>9s}")
    for extra, name, n_calls, f_calls, n_t, f_t in rows[:top]:
        per_call = extra * scale / f_calls if f_calls == n_calls and f_calls else float("nan")
        print(f"{name[-60:]:60s} {n_calls:12d} {f_calls:12d} {n_t * scale:12.0f} {f_t * scale:12.0f} "
              f"{extra * scale:10.0f} {per_call:9.2f}")
    for label, pick in (("builtins (ATen calls and other C code)", True), ("Python functions' own code", False)):
        part = [r for r in rows if r[1].startswith("~:0:") == pick]
        print(f"  {label}: {native} {sum(r[4] for r in part) * scale:.0f} {unit}, "
              f"flagos {sum(r[5] for r in part) * scale:.0f} {unit}, extra {sum(r[0] for r in part) * scale:.0f} {unit}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "0.6b"), default="tiny")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4, help="profiled decodes per device, interleaved")
    parser.add_argument("--kind", choices=("aten", "python", "both"), default="aten",
                        help="torch.profiler per ATen op, cProfile per Python-visible call, or both")
    args = parser.parse_args()
    native = "cuda" if flagos_core.runtime()["name"] == "cuda" else "cpu"
    sizes = qwen3_06b.TINY if args.model == "tiny" else {}
    dtype = torch.bfloat16 if native == "cuda" else torch.float32
    prompt = qwen3_06b.batches(1, batch=1, seq=8, vocab=sizes.get("vocab_size", 151936))[0]
    models = {device: qwen3_06b.build(device, dtype, **sizes).eval() for device in (native, "flagos")}
    described = f"{args.model} Qwen3, {args.rounds} x {args.tokens} tokens per side, interleaved"
    if args.kind in ("aten", "both"):
        times = interleaved_op_times(models, prompt, args.tokens, args.rounds)
        total_native = sum(us for _, us in times[native].values())
        total_flagos = sum(us for _, us in times["flagos"].values())
        print(f"host time in profiled ops: {native} {total_native / 1e3:.1f} ms, flagos {total_flagos / 1e3:.1f} ms "
              f"({described})")
        print_diff(times, native, args.top, "us", 1.0)
    if args.kind in ("python", "both"):
        clocks = step_clocks(models, prompt, args.tokens, args.rounds)
        (n_wall, n_cpu), (f_wall, f_cpu) = clocks[native], clocks["flagos"]
        print(f"\nper token without a profiler ({described}): wall {native} {n_wall * 1e3:.2f} ms, "
              f"flagos {f_wall * 1e3:.2f} ms (ratio {n_wall / f_wall:.3f}); thread CPU {native} {n_cpu * 1e3:.2f} ms, "
              f"flagos {f_cpu * 1e3:.2f} ms (ratio {n_cpu / f_cpu:.3f})")
        py_times = python_times(models, prompt, args.tokens, args.rounds)
        print(f"Python-visible calls under cProfile ({described}), own time:")
        print_diff(py_times, native, args.top, "us", 1e6)


if __name__ == "__main__":
    main()
