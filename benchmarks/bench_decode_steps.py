"""Greedy decode on flagos against the native device, the sides alternating
token by token, in one process.

    python benchmarks/bench_decode_steps.py [--model tiny|0.6b] [--rounds N] [--tokens N] [--counters]
                                            [--build-first native|flagos] [--processes N] [--decomposed]

Each round prefills both sides (untimed) and then decodes `tokens` tokens,
one forward with the KV cache per token (qwen3_06b.GreedySteps), native and
flagos in turn, the first side alternating: drift slower than one token
touches both sides alike. Prints each round's ratio (flagos speed over
native) and their median; the first round is a warm-up.

On the host runtime it times CPU time with one torch thread pinned to one
CPU, as bench_host_overhead.py does; on a GPU, wall time around
synchronised steps. --counters adds the CPU's event counts per token on
each side (hw_counters.py: instructions, instruction-cache and TLB misses),
over the timed rounds, on the calling thread and outside the synchronising.

--decomposed adds a third side: the flagos model again, with composite ops
(linear, SDPA, ...) decomposed on flagos as before whole_ops.txt
(flagos_core.set_whole_ops(False) around its steps), so that what running
them whole is worth reads in one process.

--build-first says which side's model is made first (default native).
--processes N runs N fresh processes of this script one after another, the
side built first alternating, and combines their medians: on the lent GPU
machine one process's ratio moved by a few percent from process to process
(0.954 to 0.987 over twelve processes of one tree), so a figure to trust
takes several. The combined ratio is order_balanced()'s
(order_balance.py): the geometric mean of the two build orders' medians.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_06b  # noqa: E402
from bench_host_overhead import load_demo  # noqa: E402
from hw_counters import HardwareCounters  # noqa: E402
from order_balance import order_balanced  # noqa: E402

DECOMPOSED = "flagos (decomposed)"  # --decomposed's side
RESULT = re.compile(r"^median ratio \(flagos speed / native\): ([0-9.]+) over")
ROUND = re.compile(r"^round \d+: .* ratio ([0-9.]+)$")  # a timed round's line (not the warm-up's)


def decode_round(models, prompt, tokens, time_step, devices=None):
    """One round: prefill every side (untimed), then `tokens` greedy tokens
    with the sides in turn per token, the first alternating. models:
    {side: model}, a side being a device unless `devices` maps it to one;
    time_step(decoder, side) gives the seconds of one decoder.step().
    Returns ({side: seconds}, whether all sides produced the same tokens)."""
    sides = list(models)
    devices = devices or {d: d for d in sides}
    decoders = {d: qwen3_06b.GreedySteps(models[d], prompt, devices[d]) for d in sides}
    spent = dict.fromkeys(sides, 0.0)
    for t in range(tokens):
        for d in (sides if t % 2 == 0 else sides[::-1]):
            spent[d] += time_step(decoders[d], d)
    made = [decoder.tokens() for decoder in decoders.values()]
    return spent, all(torch.equal(made[0], m) for m in made[1:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("tiny", "0.6b"), default="tiny")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--counters", action="store_true", help="also count CPU events per token (perf_event_open)")
    parser.add_argument("--build-first", choices=("native", "flagos"), default="native",
                        help="which side's model is made first")
    parser.add_argument("--processes", type=int, default=0,
                        help="run N fresh processes, the side built first alternating, and combine them")
    parser.add_argument("--decomposed", action="store_true",
                        help="add the flagos model with composite ops decomposed (set_whole_ops(False)) as a third side")
    args = parser.parse_args(argv)
    if args.processes:
        return run_processes(args)
    demo = load_demo()
    native = demo.native_device_for(demo.flagos_runtime_name())
    sides = (native, torch.device("flagos"))
    clock = time.perf_counter
    if native.type == "cpu":
        os.sched_setaffinity(0, {os.sched_getaffinity(0).pop()})
        torch.set_num_threads(1)
        clock = time.process_time
    sizes = qwen3_06b.TINY if args.model == "tiny" else {}
    dtype = torch.float32 if native.type == "cpu" else torch.bfloat16
    positions = sizes.get("max_position_embeddings", 4096)
    if 8 + args.tokens > positions:
        parser.error(f"--tokens: at most {positions - 8} for this model (8 prompt tokens)")
    order = sides if args.build_first == "native" else sides[::-1]
    models = {d: qwen3_06b.build(d, dtype, **sizes).eval() for d in order}
    models = {d: models[d] for d in sides}
    devices = {d: d for d in sides}
    if args.decomposed:
        import flagos_core

        models[DECOMPOSED] = models[sides[1]]  # the same model, its composite ops decomposed
        devices[DECOMPOSED] = sides[1]
    prompt = qwen3_06b.batches(1, 1, 8, vocab=sizes.get("vocab_size", 151936))[0]

    counters = HardwareCounters() if args.counters else None
    counted = {d: {} for d in sides}  # event totals over the timed rounds
    counting = [False]

    def timed_step(decoder, side):
        device = devices[side]
        if side == DECOMPOSED:
            flagos_core.set_whole_ops(False)
        demo.synchronize(device)
        before = counters.read() if counting[0] else None
        start = clock()
        decoder.step()
        if before is not None:
            for name, n in HardwareCounters.delta(before, counters.read()).items():
                counted[side][name] = counted[side].get(name, 0.0) + n
        demo.synchronize(device)
        spent = clock() - start
        if side == DECOMPOSED:
            flagos_core.set_whole_ops(True)
        return spent

    print(f"{time.strftime('%Y-%m-%d %H:%M')}  torch {torch.__version__}  {args.model} Qwen3, native {native}, "
          f"{args.tokens} tokens per round, {'CPU time, pinned' if clock is time.process_time else 'wall time'}")
    ratios, decomposed_ratios, same = [], [], True
    for r in range(args.rounds):
        counting[0] = bool(counters and counters.available and r > 0)
        spent, equal = decode_round(models, prompt, args.tokens, timed_step, devices)
        same = same and equal
        ratio = spent[sides[0]] / spent[sides[1]]
        per_token = {d: spent[d] / args.tokens * 1e3 for d in models}
        decomposed = ""
        if args.decomposed:
            decomposed_ratio = spent[sides[0]] / spent[DECOMPOSED]
            decomposed = f", decomposed {per_token[DECOMPOSED]:.3f} ms/token (ratio {decomposed_ratio:.3f})"
        print(f"round {r}{' (warm-up)' if r == 0 else ''}: native {per_token[sides[0]]:.3f} ms/token, "
              f"flagos {per_token[sides[1]]:.3f} ms/token{decomposed}, ratio {ratio:.3f}")
        if r > 0:
            ratios.append(ratio)
            if args.decomposed:
                decomposed_ratios.append(decomposed_ratio)
    print(f"median ratio (flagos speed / native): {statistics.median(ratios):.3f} over {len(ratios)} rounds; "
          f"tokens {'equal' if same else 'NOT equal'}")
    if args.decomposed:
        print(f"median ratio with composite ops decomposed (flagos speed / native): "
              f"{statistics.median(decomposed_ratios):.3f}")
    if counters is not None:
        print_counters(counters, counted, sides, args.tokens * (args.rounds - 1))
    return 0


def run_processes(args):
    """args.processes runs of this script, each in a fresh process, native
    built first in the even ones; prints each one's result as it ends (a run
    cut short still shows those done) and the combined ratio."""
    ratios, flagos_first, same = [], [], True
    for i in range(args.processes):
        first = "native" if i % 2 == 0 else "flagos"
        command = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--rounds", str(args.rounds),
                   "--tokens", str(args.tokens), "--build-first", first] + (["--decomposed"] if args.decomposed else [])
        out = subprocess.run(command, capture_output=True, text=True)
        found = [RESULT.match(line) for line in out.stdout.splitlines()]
        found = [m for m in found if m]
        if out.returncode != 0 or not found:
            print(out.stdout + out.stderr)
            print(f"process {i + 1}: failed (exit status {out.returncode})")
            return 1
        ratios.append(float(found[-1].group(1)))
        flagos_first.append(first == "flagos")
        decomposed = [line for line in out.stdout.splitlines() if line.startswith("median ratio with composite")]
        same = same and "tokens equal" in out.stdout
        # Each timed round's ratio too: a ratio rising round by round is a
        # side still warming up, which fewer rounds would count against it.
        rounds = [m.group(1) for m in map(ROUND.match, out.stdout.splitlines()) if m]
        print(f"process {i + 1}/{args.processes}, {first} built first: median ratio {ratios[-1]:.3f} "
              f"(rounds: {' '.join(rounds)})" + (f"; {decomposed[-1]}" if decomposed else ""), flush=True)
    print(f"over {len(ratios)} processes: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-"
          f"{max(ratios):.3f}, order-balanced {order_balanced(ratios, flagos_first):.3f}; "
          f"tokens {'equal' if same else 'NOT equal'} in every process")
    return 0


def print_counters(counters, counted, sides, tokens):
    if not counters.available:
        print(f"CPU event counters: not available here ({counters.why_not})")
        return
    if tokens == 0:
        print("CPU event counters: no timed round (--rounds 1)")
        return
    native, flagos = sides
    print(f"CPU event counters per token (calling thread, user space, {tokens} tokens per side):")
    print(f"{'event':<16}{'native':>16}{'flagos':>16}{'flagos extra':>16}{'ratio':>8}")
    for name in counters.names:
        n, f = counted[native][name] / tokens, counted[flagos][name] / tokens
        print(f"{name:<16}{n:>16,.0f}{f:>16,.0f}{f - n:>+16,.0f}{f / n if n else float('nan'):>8.3f}")


if __name__ == "__main__":
    sys.exit(main())
