"""Instructions per call, flagos (host runtime) against CPU, under callgrind.

    python benchmarks/count_instructions.py [--calls N] [--steps N]

Wall-clock ratios on a small shared machine move by several percent from run
to run; instruction counts do not. This runs itself under valgrind's
callgrind (valgrind and a C compiler needed: `apt install valgrind gcc`),
switches counting on only around the timed calls (client requests through a
tiny helper compiled on the fly), and prints instructions per call for the
per-op set of bench_host_overhead.py, a tiny-Qwen3 training step and one
token of its greedy decode (one forward with the KV cache).
Instructions are not time (atomics, cache misses and the allocator's system
calls cost more than they count), so this complements the timed benchmark
and does not replace it.
"""

import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile

HELPER = r"""
#include <valgrind/callgrind.h>
void count_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void count_stop(const char* name) { CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def measured(workdir, calls, steps):
    """Inside valgrind: run every case on both sides between client requests."""
    import torch

    import flagos_core  # noqa: F401
    from flagos_core import demo

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import qwen3_06b
    from bench_host_overhead import op_table

    torch.set_num_threads(1)
    lib = ctypes.CDLL(os.path.join(workdir, "helper.so"))
    for device in ("cpu", "flagos"):
        for name, fn in op_table(torch.device(device)).items():
            for _ in range(50):
                fn()
            lib.count_start()
            for _ in range(calls):
                fn()
            lib.count_stop(f"{name}|{device}".encode())
        model = demo.build_model(torch.device(device))
        opt = demo.make_optimizer(model)
        batches = demo.make_batches(steps + 3)
        demo.train_steps(model, opt, batches[:3])
        lib.count_start()
        demo.train_steps(model, opt, batches[3:])
        lib.count_stop(f"tiny Qwen3 train step|{device}".encode())
        decoder = qwen3_06b.GreedySteps(model.eval(), batches[0][:1, :8], device)
        for _ in range(3):
            decoder.step()
        lib.count_start()
        for _ in range(steps):
            decoder.step()
        lib.count_stop(f"tiny Qwen3 decode token|{device}".encode())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--steps", type=int, default=2, help="training steps, and decode tokens")
    parser.add_argument("--inside", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        measured(args.inside, args.calls, args.steps)
        return 0

    workdir = tempfile.mkdtemp(prefix="flagos-count-")
    with open(os.path.join(workdir, "helper.c"), "w") as f:
        f.write(HELPER)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", os.path.join(workdir, "helper.so"),
                    os.path.join(workdir, "helper.c")], check=True)
    out = os.path.join(workdir, "callgrind.out")
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                    sys.executable, os.path.abspath(__file__), "--inside", workdir,
                    "--calls", str(args.calls), "--steps", str(args.steps)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    counts = {}
    dumps = sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1]))  # in dump order
    for path in dumps:
        with open(path) as f:
            text = f.read()
        trigger = re.search(r"Client Request: (.*)\|(\w+)\n", text)
        total = re.search(r"^summary: (\d+)", text, re.M)
        if trigger and total:
            counts[(trigger.group(1), trigger.group(2))] = int(total.group(1))
    names = list(dict.fromkeys(name for name, _ in counts))
    print(f"{'case':24s} {'unit':10s} {'cpu':>12s} {'flagos':>12s} {'ratio':>7s}")
    for name in names:
        per = args.steps if "Qwen3" in name else args.calls
        unit = "instr/token" if "decode" in name else "instr/step" if "train" in name else "instr/call"
        cpu, flagos = counts[(name, "cpu")] / per, counts[(name, "flagos")] / per
        print(f"{name:24s} {unit:10s} {cpu:12.0f} {flagos:12.0f} {flagos / cpu:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
