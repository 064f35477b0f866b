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

--lines counts, instead, the distinct cache lines (code and data) one call
of each per-op case touches: the simulated caches are a 1 KB L1 pair, which
sends every access on to the last level, and a 4 MB last level that a 12 MB
memset empties before each call (counted separately, not in the call), so
its misses in the call are the lines the call touches. In a model on a GPU
dozens of other ops run between two calls of one op and the nearest caches
hold little of a call's lines; each line a call touches then costs a fetch
from farther out, which the per-op loop never shows. Also printed: the
lines that flagos's own library's instructions touch.
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
#include <stdlib.h>
#include <string.h>
#include <valgrind/callgrind.h>
void count_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void count_stop(const char* name) { CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION; }
/* --lines: instrumentation stays on (the cache simulation runs), counting
   is switched around each call only. */
static char* flush_buffer;
void lines_zero(void) { CALLGRIND_ZERO_STATS; }
void lines_flush(void) {
  if (!flush_buffer) flush_buffer = malloc(FLUSH_BYTES);
  memset(flush_buffer, 1, FLUSH_BYTES);
}
void lines_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void lines_dump(const char* name) { CALLGRIND_DUMP_STATS_AT(name); }
"""
LAST_LEVEL_BYTES = 4 << 20  # the simulated last level; the flush writes three times as much
CACHE_OPTIONS = ["--cache-sim=yes", "--I1=1024,2,64", "--D1=1024,2,64", f"--LL={LAST_LEVEL_BYTES},16,64"]
LINE_EVENTS = ("ILmr", "DLmr", "DLmw")


def measured(workdir, calls, steps, lines):
    """Inside valgrind: run every case on both sides between client requests.
    lines (--lines): the per-op cases only, the calls one by one, the last
    level emptied before each and counting on only during the call."""
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
            if lines:
                lib.lines_zero()
                for _ in range(calls):
                    lib.lines_flush()
                    lib.lines_toggle()
                    fn()
                    lib.lines_toggle()
                lib.lines_dump(f"{name}|{device}".encode())
                continue
            lib.count_start()
            for _ in range(calls):
                fn()
            lib.count_stop(f"{name}|{device}".encode())
        if lines:
            continue
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


def line_counts(text, events, object_names):
    """{event: count} over the cost lines of objects whose path names
    flagos_core. object_names carries callgrind's compressed object names
    from one dump file to the next (they are defined once per run)."""
    totals = dict.fromkeys(events, 0)
    current, after_call = None, False
    for line in text.splitlines():
        if line.startswith(("ob=", "cob=")):
            m = re.match(r"c?ob=\((\d+)\)(?: (.*))?", line)
            if m and m.group(2):
                object_names[m.group(1)] = m.group(2)
            if line.startswith("ob="):
                current = object_names.get(m.group(1)) if m else line[3:]
        elif line.startswith("calls="):
            after_call = True  # the next cost line is the call's inclusive cost
        elif line[:1].isdigit() or line[:1] in "+-*":
            if after_call:
                after_call = False
            elif current and "flagos_core" in current:
                values = [int(v) for v in line.split()[1:]]
                for event, value in zip(events, values):
                    if event in totals:
                        totals[event] += value
    return totals


def report_lines(dumps, calls):
    rows, object_names = {}, {}
    for path in dumps:
        with open(path) as f:
            text = f.read()
        trigger = re.search(r"Client Request: (.*)\|(\w+)\n", text)
        events = re.search(r"^events: (.*)$", text, re.M).group(1).split()
        total = re.search(r"^summary: (.*)$", text, re.M)
        own = line_counts(text, events, object_names)
        if trigger and total:
            summary = dict(zip(events, (int(v) for v in total.group(1).split())))
            rows[(trigger.group(1), trigger.group(2))] = (
                sum(summary[e] for e in LINE_EVENTS) / calls, sum(own[e] for e in LINE_EVENTS) / calls)
    print(f"cache lines a call touches, from cold ({calls} calls per case)")
    print(f"{'case':14s} {'cpu':>8s} {'flagos':>8s} {'extra':>8s} {'flagos_core':>12s}")
    for name in dict.fromkeys(name for name, _ in rows):
        cpu, flagos = rows[(name, "cpu")][0], rows[(name, "flagos")][0]
        print(f"{name:14s} {cpu:8.1f} {flagos:8.1f} {flagos - cpu:+8.1f} {rows[(name, 'flagos')][1]:12.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=None, help="calls per per-op case (default 300, --lines 20)")
    parser.add_argument("--steps", type=int, default=2, help="training steps, and decode tokens")
    parser.add_argument("--lines", action="store_true", help="count the cache lines each call touches instead")
    parser.add_argument("--inside", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calls is None:
        args.calls = 20 if args.lines else 300
    if args.inside:
        measured(args.inside, args.calls, args.steps, args.lines)
        return 0

    workdir = tempfile.mkdtemp(prefix="flagos-count-")
    with open(os.path.join(workdir, "helper.c"), "w") as f:
        f.write(HELPER)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", f"-DFLUSH_BYTES={3 * LAST_LEVEL_BYTES}", "-o",
                    os.path.join(workdir, "helper.so"), os.path.join(workdir, "helper.c")], check=True)
    out = os.path.join(workdir, "callgrind.out")
    if args.lines:
        tool = ["--collect-atstart=no", *CACHE_OPTIONS]
    else:
        tool = ["--instr-atstart=no"]
    subprocess.run(["valgrind", "--tool=callgrind", *tool, f"--callgrind-out-file={out}",
                    sys.executable, os.path.abspath(__file__), "--inside", workdir,
                    "--calls", str(args.calls), "--steps", str(args.steps)]
                   + (["--lines"] if args.lines else []),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if args.lines:
        report_lines(sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1])), args.calls)
        return 0
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
