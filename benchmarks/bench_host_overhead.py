"""Host overhead of flagos against the native device, in one process.

    python benchmarks/bench_host_overhead.py [--quick] [--json PATH] [--native-only]
                                             [--threads N] [--clock wall|cpu]

Per op: tiny tensors (16 float32 elements; mm is 64x64) so the kernel is negligible
and the time is the host path. Plus one tiny-Qwen3 training step. Both sides are
warmed up, then timed in interleaved blocks (native, flagos, flagos, native,
...: which side goes first alternates); the table gives the median of each
side and the ratio flagos/native. The native device is the one flagos runs its kernels on: cpu, or cuda on the cuda runtime.
--native-only times the native device against itself, to show the noise floor.

Clock: on the host runtime the default is the process's CPU time, with one
torch intra-op thread and the process pinned to one CPU: other load on the
machine and a hypervisor's steal time do not count. On CUDA, wall time
around synchronised blocks. --clock wall [--threads N] measures unpinned
wall time instead. Both sides share this process, so whatever flagos does to
the whole process slows the native side too: bench_train_solo.py runs each
side alone.
"""

import argparse
import datetime
import importlib.util
import itertools
import json
import os
import platform
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Ratios flagos/native we aim to stay under (see docs/performance.md).
OP_TARGET = 1.10
OP_TARGET_CUDA = 1.05
TRAIN_TARGET = 1.05


def load_demo():
    """flagos_core.demo, or the repo's copy when the installed core lacks it
    (or is not built yet, as with --native-only)."""
    try:
        import flagos_core.demo as demo

        return demo
    except ImportError:
        path = os.path.join(REPO, "flagos_core", "demo.py")
        spec = importlib.util.spec_from_file_location("flagos_demo", path)
        demo = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(demo)
        return demo


# ---------------------------------------------------------------- per-op


def op_table(device, gpu=False):
    """name -> zero-argument callable running that op on `device`. With gpu,
    also a Qwen3-0.6B decode-shaped bf16 linear (one token through a
    3072x1024 weight made like a model's parameter): cuBLAS's host path, the
    heaviest op of an eager decode step; and its decode-shaped attention."""
    a = torch.randn(16, device=device)
    b = torch.randn(16, device=device)
    m = torch.randn(64, 64, device=device)
    acc = torch.zeros(16, device=device)  # its own: the in-place row changes it
    # An optimizer's kind of foreach call (AdamW's exp_avg update) over 64
    # parameters: the written list converges on the read one, so any number
    # of calls stays in range.
    params = [torch.randn(16, device=device) for _ in range(64)]
    grads = [torch.randn(16, device=device) for _ in range(64)]
    table = {
        "add": lambda: torch.add(a, b),
        # A Python number: the binding wraps it as a CPU scalar tensor (an
        # RMSNorm's `variance + eps`).
        "add scalar": lambda: a + 1e-6,
        "add_ in place": lambda: acc.add_(b),
        "mul": lambda: torch.mul(a, b),
        "view": lambda: a.view(4, 4),
        "empty": lambda: torch.empty(16, device=device),
        "mm 64x64": lambda: torch.mm(m, m),
        "sum": lambda: a.sum(),
        "softmax": lambda: torch.softmax(a, dim=0),
        "cat": lambda: torch.cat((a, b)),
        "lerp_ x64": lambda: torch._foreach_lerp_(params, grads, 0.1),
    }
    if gpu:
        x = torch.randn(1, 1, 1024, dtype=torch.bfloat16).to(device)
        w = torch.randn(3072, 1024, dtype=torch.bfloat16).to(device)
        table["linear bf16"] = lambda: torch.nn.functional.linear(x, w)
        # One decode step's attention in Qwen3-0.6B: one query token, 16
        # heads over 8 KV heads of a 64-token cache, no mask (as transformers
        # calls it then): the fused-kernel choice and its call.
        q = torch.randn(1, 16, 1, 128, dtype=torch.bfloat16).to(device)
        kv = torch.randn(1, 8, 64, 128, dtype=torch.bfloat16).to(device)
        table["sdpa bf16"] = lambda: torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    return table


def time_calls(fn, device, calls, synchronize, clock):
    """Seconds per call over one block of `calls` back-to-back calls."""
    synchronize(device)
    t0 = clock()
    for _ in itertools.repeat(None, calls):
        fn()
    synchronize(device)
    return (clock() - t0) / calls


def bench_ops(native, flagos, calls, rounds, synchronize, clock):
    """[(op, native us, flagos us)] from interleaved blocks, medians per side."""
    gpu = torch.device(native).type == "cuda"
    ops_native, ops_flagos = op_table(native, gpu), op_table(flagos, gpu)
    rows = []
    for name in ops_native:
        sides = [(native, ops_native[name]), (flagos, ops_flagos[name])]
        for device, fn in sides:  # warm-up: caches, allocator, lazy init
            time_calls(fn, device, calls, synchronize, clock)
        samples = [[], []]
        for r in range(rounds):
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):  # which side goes first alternates
                device, fn = sides[i]
                samples[i].append(time_calls(fn, device, calls, synchronize, clock))
        rows.append((name, statistics.median(samples[0]) * 1e6, statistics.median(samples[1]) * 1e6))
    return rows


# ---------------------------------------------------------------- training step


def bench_train(demo, native, flagos, rounds, steps_per_block, clock):
    """Median seconds per tiny-Qwen3 training step each side, and loss parity."""
    batches = demo.make_batches(steps_per_block * (rounds + 1))
    sides = {}
    for label, device in (("native", native), ("flagos", flagos)):
        model = demo.build_model(device)
        sides[label] = (model, demo.make_optimizer(model))
    # Warm-up on the same batches both sides: leaves the two sides in the same state.
    demo.time_training(sides, batches, 1, steps_per_block, clock)
    timing = demo.time_training(sides, batches, rounds, steps_per_block, clock)
    same = timing["native"]["losses"] == timing["flagos"]["losses"]
    return (
        statistics.median(timing["native"]["step_s"]),
        statistics.median(timing["flagos"]["step_s"]),
        same,
    )


# ---------------------------------------------------------------- report


def machine_info(native):
    info = {"torch": torch.__version__, "python": platform.python_version(),
            "torch_threads": torch.get_num_threads()}
    try:
        with open("/proc/cpuinfo") as f:
            names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        info["cpu"] = f"{names[0]} x{len(names)}" if names else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    # Other work on the machine shows up as noise in every ratio; record it.
    info["load_average_1min"] = os.getloadavg()[0]
    info["cpu_count"] = os.cpu_count()
    if native.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(native)
    return info


def print_table(rows):
    header = ("benchmark", "unit", "native", "flagos", "ratio", "target", "")
    lines = [header] + [
        (r["name"], r["unit"], f"{r['native']:.2f}", f"{r['flagos']:.2f}",
         f"{r['ratio']:.3f}", f"<={r['target']:.2f}", "ok" if r["ratio"] <= r["target"] else "OVER")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        cells = [line[0].ljust(widths[0]), line[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(line[2:], widths[2:])]
        print("  ".join(cells).rstrip())
        if n == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds (about 15 s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--native-only", action="store_true",
                        help="time the native device against itself (no flagos needed)")
    parser.add_argument("--threads", type=int,
                        help="torch intra-op threads (1 keeps thread-pool wake-ups out of per-op times)")
    parser.add_argument("--clock", choices=("wall", "cpu"),
                        help="wall time, or the process's CPU time (default: cpu on host, wall on cuda)")
    args = parser.parse_args(argv)

    # Short blocks, many rounds: the machines we measure on drift within seconds.
    calls, op_rounds = (2000, 5) if args.quick else (3000, 15)
    train_rounds, steps_per_block = (3, 2) if args.quick else (20, 2)

    demo = load_demo()
    if args.native_only:
        runtime, native, flagos = "native-only", torch.device("cpu"), torch.device("cpu")
    else:
        runtime = demo.flagos_runtime_name()
        native, flagos = demo.native_device_for(runtime), torch.device("flagos")
    op_target = OP_TARGET_CUDA if runtime == "cuda" else OP_TARGET
    clock_name = args.clock or ("wall" if native.type == "cuda" else "cpu")
    if clock_name == "cpu":
        # Threads made from here on (autograd's device thread) inherit the pin.
        os.sched_setaffinity(0, {os.sched_getaffinity(0).pop()})
        torch.set_num_threads(1)
    elif args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if clock_name == "cpu" else time.perf_counter

    rows = []
    for name, t_native, t_flagos in bench_ops(native, flagos, calls, op_rounds, demo.synchronize, clock):
        rows.append({"name": name, "unit": "us/op", "native": t_native, "flagos": t_flagos,
                     "ratio": t_flagos / t_native, "target": op_target})
    losses_equal = None
    # A native CUDA backward cannot run in a process that registered flagos
    # (side_process.py says why): on cuda, training is bench_qwen3_cuda.py's.
    if native.type != "cuda":
        s_native, s_flagos, losses_equal = bench_train(demo, native, flagos, train_rounds, steps_per_block, clock)
        rows.append({"name": "tiny Qwen3 train step", "unit": "ms/step", "native": s_native * 1e3,
                     "flagos": s_flagos * 1e3, "ratio": s_flagos / s_native, "target": TRAIN_TARGET})

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "runtime": runtime,
        "native_device": str(native),
        "machine": machine_info(native),
        "settings": {"clock": clock_name, "calls_per_block": calls, "op_rounds": op_rounds,
                     "train_rounds": train_rounds, "steps_per_block": steps_per_block},
        "train_losses_equal": losses_equal,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)

    m = result["machine"]
    print(f"{result['date']}  torch {m['torch']}  {m.get('gpu', m['cpu'])}")
    print(f"runtime {runtime}, native {native}; {op_rounds} rounds x {calls} calls per op, "
          f"{train_rounds} rounds x {steps_per_block} train steps; medians of interleaved blocks; "
          f"{clock_name} clock" + (", pinned to one CPU" if clock_name == "cpu" else ""))
    print(f"training losses bitwise equal: {'n/a' if losses_equal is None else 'yes' if losses_equal else 'NO'};  "
          f"load average {m['load_average_1min']:.1f} on {m['cpu_count']} CPUs, "
          f"{m['torch_threads']} torch threads")
    print()
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
