"""What the GPU runs in a Qwen3-0.6B bf16 training step, flagos against
native CUDA: the kernels (names, launches), their device time per step, and
the step's wall time without the profiler, hence how busy the GPU is.

The training rows of bench_qwen3_cuda.py spread by several percent from one
pair of processes to the next. This tells apart what a ratio below 1 could
come from: flagos running other or slower kernels (the device time differs),
or the host (same kernels and device time; then the gap can only show where
the GPU waits for the host, i.e. where it is not busy).

    python benchmarks/bench_train_kernels.py [--sizes 1x128,8x1024] [--blocks 3] [--json PATH]

Each side trains in a process of its own (side_process.py says why), both
started together, the first one alternating between sizes. Per size and side:
a warm-up block, `--blocks` timed blocks (their median), then one block under
torch.profiler with device activity only.
"""

import argparse
import json
import statistics
import sys
import tempfile

import torch

import qwen3_06b
from side_process import SideProcess

SIDES = ("cuda", "flagos")


def compare_kernels(native, flagos):
    """Two {name: [launches, device us]} tables of one block: whether the same
    kernels ran as often, and the kernels whose launches or time differ most
    ([(name, native launches, flagos launches, native us, flagos us)], by
    the size of the time difference)."""
    names = set(native) | set(flagos)
    zero = [0, 0.0]
    same = all((native.get(n, zero)[0] == flagos.get(n, zero)[0]) for n in names)
    rows = [(n, native.get(n, zero)[0], flagos.get(n, zero)[0], native.get(n, zero)[1], flagos.get(n, zero)[1])
            for n in names]
    rows.sort(key=lambda r: -abs(r[4] - r[3]))
    return same, rows


def device_totals(kernels):
    """(launches, device us) of a whole table."""
    return sum(v[0] for v in kernels.values()), sum(v[1] for v in kernels.values())


def measure(size, blocks, steps, model_path, first):
    batch, seq = size
    procs = {side: SideProcess(side) for side in (SIDES if first == SIDES[0] else SIDES[::-1])}
    try:
        found = {}
        for side, proc in procs.items():
            proc("trainer", dtype="bfloat16", batch=batch, seq=seq, steps_per_block=steps, blocks=blocks + 2,
                 model_path=model_path)
        for side, proc in procs.items():
            proc("block", index=0)  # warm-up
        walls = {side: [] for side in procs}
        for b in range(blocks):
            for side in (list(procs) if b % 2 == 0 else list(procs)[::-1]):
                walls[side].append(procs[side]("block", index=1 + b)["seconds"] / steps)
        for side, proc in procs.items():
            kernels = proc("device_work", index=blocks + 1)["kernels"]
            launches, device_us = device_totals(kernels)
            found[side] = dict(wall_s=statistics.median(walls[side]), walls=walls[side], kernels=kernels,
                               launches=launches / steps, device_s=device_us / steps / 1e6)
            proc("close")
        return found
    finally:
        for proc in procs.values():
            proc.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1x128,8x1024", help="batch x seq, comma-separated")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks per side (median)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_train_kernels: needs a CUDA GPU (native CUDA is one side)")
        return 1
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_path = f"{tmp}/qwen3-0.6b-bf16.pt"
        qwen3_06b.save_initialised(model_path, torch.bfloat16)
        for i, size in enumerate(sizes):
            steps = 2 if size[0] * size[1] <= 1024 else 1
            results[size] = measure(size, args.blocks, steps, model_path, SIDES[i % 2])
            print(f"  {size[0]}x{size[1]} done", flush=True)

    print("\nQwen3-0.6B bf16 training step: what the GPU ran (torch.profiler, device activity), "
          "wall time without the profiler")
    print(f"{'size':>8} {'side':>7} {'wall ms':>9} {'device ms':>10} {'GPU busy':>9} {'launches':>9}  "
          f"same kernels   device time flagos/native   wall ratio native/flagos")
    native = SIDES[0]
    for size, found in results.items():
        same, rows = compare_kernels(found[native]["kernels"], found["flagos"]["kernels"])
        for side in SIDES:
            f = found[side]
            extra = ""
            if side == "flagos":
                extra = (f"  {'yes' if same else 'NO':>12}   {f['device_s'] / found[native]['device_s']:>27.4f}"
                         f"   {found[native]['wall_s'] / f['wall_s']:>24.3f}")
            print(f"{size[0]}x{size[1]:<6} {side:>7} {f['wall_s'] * 1e3:9.2f} {f['device_s'] * 1e3:10.2f} "
                  f"{f['device_s'] / f['wall_s']:9.1%} {f['launches']:9.0f}{extra}")
        if not same:
            print(f"  kernels that differ at {size[0]}x{size[1]} (launches native/flagos, us native/flagos):")
            for name, ln, lf, un, uf in [r for r in rows if r[1] != r[2]][:10]:
                print(f"    {ln:5d} {lf:5d} {un:10.1f} {uf:10.1f}  {name[:100]}")
        print(f"  largest device-time differences at {size[0]}x{size[1]} (us per block, native/flagos):")
        for name, ln, lf, un, uf in rows[:5]:
            print(f"    {un:10.1f} {uf:10.1f}  ({ln}/{lf} launches)  {name[:100]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{b}x{s}": {side: found[side] for side in SIDES}
                       for (b, s), found in results.items()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
