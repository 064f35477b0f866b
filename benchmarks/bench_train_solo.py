"""Tiny-Qwen3 training, each side alone in its own process, as a user runs it.

    python benchmarks/bench_train_solo.py [--rounds 4] [--blocks 9] [--threads N]

bench_host_overhead.py runs both sides in one process, which hides anything
flagos does to the whole process: on the host runtime, a flagos backward on
autograd's worker thread started a second OpenMP team that slowed the CPU
side's kernels as much as flagos's own (one process: ratio 0.90 to 0.94;
alone: flagos 1.5 to 2.2x CPU). Here each round starts a fresh process per
side (alternating which goes first), times `--blocks` blocks of 5 steps after
a warm-up block (the process's median block), unpinned, wall clock, torch's
default threads unless --threads; medians over rounds and the ratio
flagos/CPU. Host runtime only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time, statistics, torch
from flagos_core import demo
device, blocks, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if threads > 0:
    torch.set_num_threads(threads)
batches = demo.make_batches(8)
model = demo.build_model(torch.device(device))
sides = {device: (model, demo.make_optimizer(model))}
demo.time_training(sides, batches, 1, 5, time.perf_counter)  # warm-up
timing = demo.time_training(sides, batches, blocks, 5, time.perf_counter)
print(json.dumps({"step_s": statistics.median(timing[device]["step_s"]), "losses": timing[device]["losses"],
                  "threads": torch.get_num_threads()}))
"""


def run_side(device, blocks, threads):
    out = subprocess.run([sys.executable, "-c", CHILD, device, str(blocks), str(threads)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=9, help="blocks of 5 steps per process (median taken)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    times = {"cpu": [], "flagos": []}
    losses = {}
    threads = None
    for r in range(args.rounds):
        for device in (("cpu", "flagos") if r % 2 == 0 else ("flagos", "cpu")):
            result = run_side(device, args.blocks, args.threads)
            times[device].append(result["step_s"])
            losses[device] = result["losses"]
            threads = result["threads"]
    cpu, flagos = statistics.median(times["cpu"]), statistics.median(times["flagos"])
    print(f"tiny Qwen3 training, one process per side and round, {args.rounds} rounds x {args.blocks} blocks of 5 steps, "
          f"{threads} torch threads, {os.cpu_count()} CPUs, unpinned wall clock")
    print(f"cpu    {cpu * 1e3:8.2f} ms/step  (rounds: {', '.join(f'{t * 1e3:.1f}' for t in times['cpu'])})")
    print(f"flagos {flagos * 1e3:8.2f} ms/step  (rounds: {', '.join(f'{t * 1e3:.1f}' for t in times['flagos'])})")
    print(f"ratio flagos/cpu {flagos / cpu:.3f}  (target <= 1.05); losses bitwise equal: "
          f"{'yes' if losses['cpu'] == losses['flagos'] else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
