"""Recurrent layers on the host runtime against CPU, in one process.

    python benchmarks/bench_host_recurrent.py [--rounds N]

A 2-layer nn.LSTM and nn.GRU, 256 wide, 32 steps of batch 8, float32:
forward alone (no grad) and forward plus backward. On the host runtime both
take CPU's own decompositions (flagos_core/_host_rnn.py). Interleaved blocks, the side that goes
first alternating; medians per side; the process's CPU time, pinned to one
CPU with one torch thread (as bench_host_overhead.py's default clock). Prints
ms per call and the speed ratio native/flagos (1.0 is CPU's speed).
"""

import argparse
import os
import statistics
import sys
import time

import torch

import flagos_core

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_host_overhead import time_calls  # noqa: E402

BLOCK = 5  # calls per timed block


def cases():
    for layer in ("LSTM", "GRU"):
        torch.manual_seed(0)
        cpu = getattr(torch.nn, layer)(256, 256, num_layers=2)
        flagos = getattr(torch.nn, layer)(256, 256, num_layers=2)
        flagos.load_state_dict(cpu.state_dict())
        flagos.to("flagos")
        x = torch.randn(32, 8, 256)
        sides = ((cpu, x), (flagos, x.to("flagos")))
        yield f"{layer} forward", [lambda m=m, x=x: _forward(m, x) for m, x in sides]
        yield f"{layer} forward+backward", [lambda m=m, x=x: _train(m, x) for m, x in sides]


def _forward(module, x):
    with torch.no_grad():
        module(x)


def _train(module, x):
    module.zero_grad(set_to_none=True)
    module(x)[0].sum().backward()


def block_seconds(fn):
    # Seconds of the process's CPU time per call over one block (the host
    # runtime needs no synchronising).
    return time_calls(fn, None, BLOCK, lambda _: None, time.process_time)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    if flagos_core.runtime()["name"] != "host":
        sys.exit("bench_host_recurrent.py compares the host runtime with CPU; this process runs "
                 f"the {flagos_core.runtime()['name']} runtime")
    os.sched_setaffinity(0, {os.sched_getaffinity(0).pop()})
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; {args.rounds} rounds x {BLOCK} calls; process CPU time, one CPU, one thread")
    print(f"{'case':<24} {'cpu ms':>9} {'flagos ms':>10} {'speed ratio':>12}")
    for name, fns in cases():
        for fn in fns:  # warm-up
            block_seconds(fn)
        samples = [[], []]
        for r in range(args.rounds):
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                samples[i].append(block_seconds(fns[i]))
        cpu, flagos = (statistics.median(s) * 1e3 for s in samples)
        print(f"{name:<24} {cpu:>9.2f} {flagos:>10.2f} {cpu / flagos:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
