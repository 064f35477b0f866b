"""Qwen3-0.6B on flagos (cuda runtime) vs native CUDA on one GPU: training
throughput (bf16, batch 1 x 128 and 8 x 1024), greedy decode (eager on both
sides, and flagos replaying a CUDA graph of one decode step against native
eager), peak memory of a training step. Medians, ratios.

Interleaving: the lent GPU machine's host speed drifts within seconds, so
the sides alternate in short blocks (training: one or two steps; decode:
whole generate calls, and in the step-interleaved row single tokens), and
which side goes first alternates too. The "pairs" column gives the spread
(quartiles) of the ratio taken within each round: how far one run's ratio
can be trusted.

Exactness: training losses are compared in a separate short pass with
torch.use_deterministic_algorithms on both sides, because native CUDA is not
reproducible against itself at 8 x 1024 (its attention backward accumulates
with atomics: two native runs part in the 5th step). The timed passes use the
default kernels, as users do; whether their losses matched is printed too.

Native training runs in a helper process (native_side.py says why); decode
runs both sides in this process. --pin pins both processes to the same two
CPUs; off by default, because it slowed flagos's 1 x 128 training far more
than native's (docs/performance.md).

    python benchmarks/bench_qwen3_cuda.py [--rounds 5] [--step-rounds 3] [--json PATH] [--pin]
                                          [--decode-only | --native-only]

--native-only times the training rows with native CUDA on both sides (two
helper processes): what the rows read when there is nothing to find.
"""

import argparse
import json
import os
import statistics
import time

# Deterministic cuBLAS (the exactness pass) needs a fixed workspace; set
# before CUDA starts, for both sides alike (the helper inherits it).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

import flagos_core  # noqa: E402
import qwen3_06b  # noqa: E402
from bench_decode_steps import decode_round  # noqa: E402
from native_side import NativeSide  # noqa: E402

SIDES = ("cuda", "flagos")
# (batch, seq, steps per block, rounds): short blocks, many rounds.
TRAINING = ((1, 128, 2, 15), (8, 1024, 1, 9))


def alternating(rounds):
    """(round, sides in the order they run): round 0 is a warm-up, and the
    side that goes first alternates from round to round."""
    for r in range(rounds + 1):
        yield r, (SIDES if r % 2 == 0 else SIDES[::-1])


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q[0], q[2]


def summary(work, seconds):
    """{side: work per second from the median block}, and the quartiles of
    flagos's speed over native's within each round."""
    rates = {side: work / statistics.median(s) for side, s in seconds.items()}
    pairs = [n / f for n, f in zip(seconds["cuda"], seconds["flagos"])]
    return rates, quartiles(pairs)


class RemoteTrainer:
    """A bf16 qwen3_06b.Trainer in a native_side.py process, with the same
    methods as a local one."""

    def __init__(self, side, **common):
        self.side = side
        side("trainer", dtype="bfloat16", **common)

    def block(self, index):
        reply = self.side("block", index=index)
        return reply["seconds"], reply["losses"]

    def peak_bytes(self, index):
        return self.side("peak", index=index)["bytes"]

    def close(self):
        self.side("close")


def bench_training(native, batch, seq, steps, rounds, second_native=None):
    """Native (in its helper process) against flagos, or, given
    second_native, against native CUDA in a second helper process: the same
    measurement with nothing to find, its noise floor."""
    common = dict(batch=batch, seq=seq, steps_per_block=steps, blocks=rounds + 1)
    trainers = {"cuda": RemoteTrainer(native, **common)}
    trainers["flagos"] = (qwen3_06b.Trainer("flagos", torch.bfloat16, **common) if second_native is None
                          else RemoteTrainer(second_native, **common))
    seconds = {side: [] for side in SIDES}
    losses = {side: [] for side in SIDES}
    for r, order in alternating(rounds):
        for side in order:
            block_seconds, block_losses = trainers[side].block(r)
            losses[side] += block_losses
            if r > 0:
                seconds[side].append(block_seconds)
    peaks = {side: trainer.peak_bytes(0) for side, trainer in trainers.items()}
    for trainer in trainers.values():
        trainer.close()
    tok_s, pairs = summary(batch * seq * steps, seconds)
    return tok_s, pairs, losses["cuda"] == losses["flagos"], peaks


def deterministic_losses_equal(native, batch, seq, steps):
    """Whether one block of training gives bitwise equal losses on both sides
    with deterministic algorithms on (then switched off again)."""
    native("deterministic", on=True)
    torch.use_deterministic_algorithms(True)
    try:
        common = dict(batch=batch, seq=seq, steps_per_block=steps, blocks=1)
        native("trainer", dtype="bfloat16", **common)
        reference = native("block", index=0)["losses"]
        native("close")
        local = qwen3_06b.Trainer("flagos", torch.bfloat16, **common)
        _, flagos_losses = local.block(0)
        local.close()
    finally:
        native("deterministic", on=False)
        torch.use_deterministic_algorithms(False)
    return reference == flagos_losses


def timed(run):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = run()
    torch.cuda.synchronize()
    return time.perf_counter() - start, result


def timed_rounds(runs, rounds):
    """Each side's run once per round, the sides alternating (alternating()):
    ({side: seconds of each timed round}, {side: its last run's result})."""
    seconds = {side: [] for side in SIDES}
    results = {}
    for r, order in alternating(rounds):
        for side in order:
            took, results[side] = timed(runs[side])
            if r > 0:
                seconds[side].append(took)
    return seconds, results


def bench_decode(models, prompt, rounds, new_tokens):
    """Whole generate calls per block."""
    runs = {side: (lambda side=side: qwen3_06b.greedy(models[side], prompt, new_tokens, side)) for side in SIDES}
    seconds, tokens = timed_rounds(runs, rounds)
    tok_s, pairs = summary(new_tokens, seconds)
    return tok_s, pairs, torch.equal(tokens["cuda"], tokens["flagos"])


def bench_decode_steps(models, prompt, rounds, new_tokens):
    """Greedy decode alternating the sides token by token (prefill untimed):
    drift slower than one token touches both sides alike."""
    seconds = {side: [] for side in SIDES}  # per round: the sum of its tokens
    same = True
    for r, _ in alternating(rounds):
        spent, equal = decode_round(models, prompt, new_tokens, lambda decoder, side: timed(decoder.step)[0])
        same = same and equal
        if r > 0:
            for side in SIDES:
                seconds[side].append(spent[side])
    tok_s, pairs = summary(new_tokens, seconds)
    return tok_s, pairs, same


def bench_decode_graphed(models, prompt, rounds, new_tokens):
    """flagos decoding with a static cache and CUDA graph replay against native
    eager greedy (generate, as bench_decode). A flagos call includes prefill,
    the eager warm-up steps and the capture, as a native call includes prefill.

    Exactness is judged against native eager generate on the same static
    cache: the default dynamic cache attends over the grown length without a
    mask, other kernels, so bf16 tokens can part by rounding alone. Equality
    with the timed native tokens is returned as well."""
    runs = {
        "cuda": lambda: qwen3_06b.greedy(models["cuda"], prompt, new_tokens, "cuda"),
        "flagos": lambda: qwen3_06b.greedy_graphed(models["flagos"], prompt, new_tokens, "flagos"),
    }
    seconds, tokens = timed_rounds(runs, rounds)
    static = qwen3_06b.greedy(models["cuda"], prompt, new_tokens, "cuda", static_cache=True)
    tok_s, pairs = summary(new_tokens, seconds)
    return tok_s, pairs, torch.equal(tokens["flagos"], static), torch.equal(tokens["flagos"], tokens["cuda"])


def row(name, rates, pairs, target, same):
    return dict(measure=name, native=rates["cuda"], flagos=rates["flagos"], ratio=rates["flagos"] / rates["cuda"],
                pairs=pairs, target=target, exact=same)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the generate-based decode rows")
    parser.add_argument("--step-rounds", type=int, default=3, help="rounds of the step-interleaved decode row")
    parser.add_argument("--json")
    parser.add_argument("--pin", action="store_true", help="pin both processes to the same two CPUs")
    parser.add_argument("--decode-only", action="store_true", help="skip the training rows")
    parser.add_argument("--native-only", action="store_true",
                        help="training rows only, native CUDA in two helper processes: the rows' noise floor")
    args = parser.parse_args()
    if args.native_only and args.decode_only:
        parser.error("--native-only times training only; it cannot go with --decode-only")
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))[:2]
        os.sched_setaffinity(0, cpus)  # before the native helper starts: it inherits the pin
        print(f"pinned to CPUs {cpus}")
    assert flagos_core.runtime()["name"] == "cuda", "flagos is not on the cuda runtime here"
    rows, timed_equal = [], []
    start = time.perf_counter()

    def add(r):  # with a progress line, so a run cut short still shows its rows
        rows.append(r)
        print(f"[{time.perf_counter() - start:4.0f} s] {r['measure']}: {r['ratio']:.3f}", flush=True)

    native = NativeSide()
    second_native = NativeSide() if args.native_only else None
    try:
        for batch, seq, steps, rounds in () if args.decode_only else TRAINING:
            tok_s, pairs, same_timed, peaks = bench_training(native, batch, seq, steps, rounds, second_native)
            same = None if args.native_only else deterministic_losses_equal(native, batch, seq, 8 if batch == 1 else 3)
            timed_equal.append(f"{batch}x{seq} {'equal' if same_timed else 'not equal'}")
            add(row(f"train bf16 {batch}x{seq} tok/s", tok_s, pairs, ">= 0.98", same))
            add(row(f"peak mem train {batch}x{seq} MiB", {s: b / 2**20 for s, b in peaks.items()},
                    (None, None), "<= 1.01", None))
    finally:
        native.close()
        if second_native is not None:
            second_native.close()
    if args.native_only:
        report(rows, args.json, "native-only: both columns are native CUDA, each in its own helper process; "
               "losses of the timed passes: " + ", ".join(timed_equal))
        return
    models = {side: qwen3_06b.build(side, torch.bfloat16).eval() for side in SIDES}
    prompt = qwen3_06b.batches(1, 1, 16)[0]
    tok_s, pairs, same = bench_decode(models, prompt, args.rounds, 64)
    add(row("decode bs1 64 tokens tok/s", tok_s, pairs, ">= 0.97", same))
    tok_s, pairs, same = bench_decode_steps(models, prompt, args.step_rounds, 64)
    add(row("decode, sides alternate per token", tok_s, pairs, ">= 0.97", same))
    tok_s, pairs, same, same_dynamic = bench_decode_graphed(models, prompt, args.rounds, 64)
    add(row("decode bs1 64 tok graph tok/s", tok_s, pairs, "-", same))
    del models
    torch.cuda.empty_cache()

    notes = []
    if not args.decode_only:
        notes.append("train rows: exact = losses bitwise equal with deterministic algorithms on both sides; "
                     "losses of the timed passes (default kernels): " + ", ".join(timed_equal))
    notes.append("per-token row: greedy with the dynamic cache, one forward per token, no generate loop around it")
    notes.append("graph row: flagos replays a CUDA graph per token, native runs eager generate; exact compares "
                 "with native generate on the same static cache; with the timed native (dynamic cache) tokens: "
                 + ("equal" if same_dynamic else "not equal"))
    report(rows, args.json, *notes)


def report(rows, json_path, *notes):
    """The table, notes under it, and the rows as JSON if asked."""
    print(f"\nQwen3-0.6B, {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'measure':34s} {'native':>10s} {'flagos':>10s} {'ratio':>7s} {'pairs q1-q3':>13s} {'target':>8s}  exact")
    for r in rows:
        exact = "-" if r["exact"] is None else ("yes" if r["exact"] else "NO")
        q1, q3 = r["pairs"]
        pairs = "-" if q1 is None else f"{q1:.3f}-{q3:.3f}"
        print(f"{r['measure']:34s} {r['native']:10.1f} {r['flagos']:10.1f} {r['ratio']:7.3f} {pairs:>13s} "
              f"{r['target']:>8s}  {exact}")
    for note in notes:
        print(note)
    if json_path:
        with open(json_path, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
