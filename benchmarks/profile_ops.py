"""Where flagos spends more host time than the native device, op by op.

    python benchmarks/profile_ops.py [--model tiny|0.6b] [--tokens N] [--top K]

Greedy-decodes with a Qwen3 on the native device and on flagos (same model,
same prompt, one process) under torch.profiler (CPU activity: the host side of
every ATen call), and prints the ops whose total time grew most on flagos, per
call and in all. Meant for the case where a whole model is slower than the
per-op benchmark predicts: the top rows say which ops to look at.
"""

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import flagos_core

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_06b  # noqa: E402


def op_times(model, prompt, tokens, device):
    """{op name: (calls, total self CPU us)} over one greedy decode."""
    qwen3_06b.greedy(model, prompt, 2, device)  # warm-up: lazy init, caches
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        qwen3_06b.greedy(model, prompt, tokens, device)
    return {e.key: (e.count, e.self_cpu_time_total) for e in prof.key_averages()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "0.6b"), default="tiny")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    native = "cuda" if flagos_core.runtime()["name"] == "cuda" else "cpu"
    sizes = qwen3_06b.TINY if args.model == "tiny" else {}
    dtype = torch.bfloat16 if native == "cuda" else torch.float32
    prompt = qwen3_06b.batches(1, batch=1, seq=8, vocab=sizes.get("vocab_size", 151936))[0]
    times = {}
    for device in (native, "flagos"):
        model = qwen3_06b.build(device, dtype, **sizes).eval()
        times[device] = op_times(model, prompt, args.tokens, device)
        del model
    rows = []
    for name in set(times[native]) | set(times["flagos"]):
        n_calls, n_us = times[native].get(name, (0, 0.0))
        f_calls, f_us = times["flagos"].get(name, (0, 0.0))
        rows.append((f_us - n_us, name, n_calls, f_calls, n_us, f_us))
    rows.sort(reverse=True)
    total_native = sum(us for _, us in times[native].values())
    total_flagos = sum(us for _, us in times["flagos"].values())
    print(f"host time in profiled ops: {native} {total_native / 1e3:.1f} ms, flagos {total_flagos / 1e3:.1f} ms "
          f"({args.model} Qwen3, {args.tokens} tokens)")
    print(f"{'op':48s} {'calls ' + native:>12s} {'calls flagos':>12s} {native + ' us':>12s} {'flagos us':>12s} {'extra us':>10s}")
    for extra, name, n_calls, f_calls, n_us, f_us in rows[:args.top]:
        print(f"{name[:48]:48s} {n_calls:12d} {f_calls:12d} {n_us:12.0f} {f_us:12.0f} {extra:10.0f}")


if __name__ == "__main__":
    main()
