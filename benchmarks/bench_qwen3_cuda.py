"""Qwen3-0.6B on flagos (cuda runtime) vs native CUDA on one GPU: training
throughput (bf16, batch 1 x 128 and 8 x 1024), greedy decode (eager on both
sides, and flagos replaying a CUDA graph of one decode step against native
eager), peak memory of a training step. Medians, ratios.

Interleaving: the lent GPU machine's host speed drifts within seconds, so
the sides alternate in short blocks (training: one or two steps; decode:
whole generate calls, and in the step-interleaved row single tokens), and
which side goes first alternates too.

Training runs each side in a process of its own (side_process.py says why),
and in several fresh pairs of processes (--pairs): two processes of one
program differ in speed by up to ~10% on the lent machine, whichever device
they drive, so one pair cannot tell a few percent. --pin N pins both
processes of every pair to the same N CPUs, so that they run on the same
cores in turn (tried on an H200 machine: the pairs spread as much, and the
1 x 128 step got slower; docs/performance.md). Decode runs both sides in
this process.

The "spread" column gives the quartiles of the ratio over its samples: for
decode the ratio within each round, for training the ratio of each pair of
processes. How far the row's ratio can be trusted.

Exactness: training losses are compared in a separate short pass with
torch.use_deterministic_algorithms on both sides, because native CUDA is not
reproducible against itself at 8 x 1024 (its attention backward accumulates
with atomics: two native runs part in the 5th step). The timed passes use the
default kernels, as users do; whether their losses matched is printed too.

    python benchmarks/bench_qwen3_cuda.py [--pairs 5] [--pin N] [--rounds 5] [--step-rounds 6] [--json PATH]
                                          [--decode-only | --train-only | --native-only]

--native-only times the training rows with native CUDA on both sides (both
in processes of their own, as flagos's are): what the rows read when there
is nothing to find.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

# Deterministic cuBLAS (the exactness pass) needs a fixed workspace; set
# before CUDA starts, for both sides alike (the helper inherits it).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

import flagos_core  # noqa: E402
import qwen3_06b  # noqa: E402
from bench_decode_steps import decode_round  # noqa: E402
from order_balance import order_balanced  # noqa: E402
from side_process import SideProcess  # noqa: E402

SIDES = ("cuda", "flagos")
# (batch, seq, steps per block, rounds per pair of processes): short blocks.
# The 1 x 128 step is bound by the host (the GPU is busy a quarter of it), and
# its blocks spread by 10 to 30% within one process: more of them.
TRAINING = ((1, 128, 2, 16), (8, 1024, 1, 6))


def alternating(rounds, first=SIDES):
    """(round, sides in the order they run): round 0 is a warm-up, and the
    side that goes first alternates from round to round, starting with
    first[0]."""
    for r in range(rounds + 1):
        yield r, (first if r % 2 == 0 else first[::-1])


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q[0], q[2]


def summary(work, seconds):
    """{side: work per second from the median block}, and the quartiles of
    flagos's speed over native's within each round."""
    rates = {side: work / statistics.median(s) for side, s in seconds.items()}
    return rates, quartiles([n / f for n, f in zip(seconds["cuda"], seconds["flagos"])])


def train_pair(procs, batch, seq, steps, rounds, model_path):
    """One training size on one pair of side processes: ({side: median block
    seconds}, whether the timed losses were equal, {side: peak bytes}). The
    side started first also trains first, so that over the pairs each side
    takes each place in the sequence of blocks equally often."""
    common = dict(dtype="bfloat16", batch=batch, seq=seq, steps_per_block=steps, blocks=rounds + 2,
                  model_path=model_path)
    for proc in procs.values():
        proc("trainer", **common)
    seconds = {side: [] for side in SIDES}
    losses = {side: [] for side in SIDES}
    for r, order in alternating(rounds, first=tuple(procs)):
        for side in order:
            reply = procs[side]("block", index=r)
            losses[side] += reply["losses"]
            if r > 0:
                seconds[side].append(reply["seconds"])
    peaks = {side: proc("peak", index=rounds + 1)["bytes"] for side, proc in procs.items()}
    for proc in procs.values():
        proc("close")
    medians = {side: statistics.median(s) for side, s in seconds.items()}
    return medians, losses["cuda"] == losses["flagos"], peaks


def deterministic_losses_equal(procs, batch, seq, steps, model_path):
    """Whether one block of training gives bitwise equal losses on both sides
    with deterministic algorithms on (then switched off again)."""
    losses = {}
    for side, proc in procs.items():
        proc("deterministic", on=True)
        try:
            proc("trainer", dtype="bfloat16", batch=batch, seq=seq, steps_per_block=steps, blocks=1,
                 model_path=model_path)
            losses[side] = proc("block", index=0)["losses"]
            proc("close")
        finally:
            proc("deterministic", on=False)
    return losses["cuda"] == losses["flagos"]


def bench_training(devices, model_path, pairs, check_exact=True, cpus=None):
    """Each side trains in a process of its own (side_process.py says why),
    in `pairs` fresh pairs of processes, the sides alternating block by block
    within a pair. Each pair's ratio is native's median block time over
    flagos's; a size's ratio combines them with order_balanced(), its spread
    is their quartiles. {(batch, seq): dict(tok_s, ratio, spread, same_timed,
    peaks, same)}; same is None without check_exact. cpus: pin both
    processes of a pair to these CPUs."""
    found = {size[:2]: dict(medians={side: [] for side in SIDES}, ratios=[], flagos_first=[], same_timed=True,
                            peaks=None, same=None)
             for size in TRAINING}
    start = time.perf_counter()
    for p in range(pairs):
        # Started together, the first one alternating: neither side always
        # gets the first pick of the machine.
        procs = {side: SideProcess(devices[side], cpus) for side in (SIDES if p % 2 == 0 else SIDES[::-1])}
        try:
            for batch, seq, steps, rounds in TRAINING:
                medians, same_timed, peaks = train_pair(procs, batch, seq, steps, rounds, model_path)
                entry = found[batch, seq]
                for side in SIDES:
                    entry["medians"][side].append(medians[side])
                entry["ratios"].append(medians["cuda"] / medians["flagos"])
                entry["flagos_first"].append(next(iter(procs)) == "flagos")
                entry["same_timed"] = entry["same_timed"] and same_timed
                if p == 0:
                    entry["peaks"] = peaks
                    if check_exact:
                        entry["same"] = deterministic_losses_equal(procs, batch, seq, 8 if batch == 1 else 3,
                                                                   model_path)
                rates = ", ".join(f"{side} {batch * seq * steps / medians[side]:.0f}" for side in procs)
                print(f"  pair {p + 1}/{pairs} {batch}x{seq}: {entry['ratios'][-1]:.3f} "
                      f"(tok/s, first-trained first: {rates}; {time.perf_counter() - start:.0f} s into the pairs)",
                      flush=True)
        finally:
            for proc in procs.values():
                proc.close()
    for (batch, seq, steps, _) in TRAINING:
        entry = found[batch, seq]
        entry["tok_s"] = {side: batch * seq * steps / statistics.median(m) for side, m in entry["medians"].items()}
        entry["ratio"] = order_balanced(entry["ratios"], entry["flagos_first"])
        entry["spread"] = quartiles(entry["ratios"])
    return found


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
    tok_s, spread = summary(new_tokens, seconds)
    return tok_s, spread, torch.equal(tokens["cuda"], tokens["flagos"])


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
    tok_s, spread = summary(new_tokens, seconds)
    return tok_s, spread, same


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
    tok_s, spread = summary(new_tokens, seconds)
    return tok_s, spread, torch.equal(tokens["flagos"], static), torch.equal(tokens["flagos"], tokens["cuda"])


def row(name, rates, spread, target, same, ratio=None):
    """ratio: flagos over native, by default the ratio of the two rates (nan
    where native's is 0: the CPU stand-in reports no peak memory)."""
    if ratio is None:
        ratio = rates["flagos"] / rates["cuda"] if rates["cuda"] else float("nan")
    return dict(measure=name, native=rates["cuda"], flagos=rates["flagos"], ratio=ratio, spread=spread,
                target=target, exact=same)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the generate-based decode rows")
    parser.add_argument("--step-rounds", type=int, default=6, help="rounds of the step-interleaved decode row")
    parser.add_argument("--json")
    parser.add_argument("--pairs", type=int, default=4,
                        help="fresh pairs of side processes for the training rows (even: each side first as often)")
    parser.add_argument("--pin", type=int, metavar="N",
                        help="pin both training processes of a pair to the same N CPUs (this process's last N)")
    parser.add_argument("--decode-only", action="store_true", help="skip the training rows")
    parser.add_argument("--train-only", action="store_true", help="skip the decode rows")
    parser.add_argument("--native-only", action="store_true",
                        help="training rows only, native CUDA on both sides: the rows' noise floor")
    args = parser.parse_args()
    if args.decode_only and (args.native_only or args.train_only):
        parser.error("--decode-only cannot go with --native-only or --train-only (both time training only)")
    cpus = sorted(os.sched_getaffinity(0))[-args.pin:] if args.pin else None
    assert flagos_core.runtime()["name"] == "cuda", "flagos is not on the cuda runtime here"
    rows, timed_equal = [], []
    start = time.perf_counter()

    def add(r):  # with a progress line, so a run cut short still shows its rows
        rows.append(r)
        print(f"[{time.perf_counter() - start:4.0f} s] {r['measure']}: {r['ratio']:.3f}", flush=True)

    devices = {side: "cuda" if args.native_only else side for side in SIDES}
    notes = []
    if not args.decode_only:
        with tempfile.TemporaryDirectory() as tmp:
            model_path = os.path.join(tmp, "qwen3-0.6b-bf16.pt")
            qwen3_06b.save_initialised(model_path, torch.bfloat16)  # each side process maps it
            found = bench_training(devices, model_path, args.pairs, check_exact=not args.native_only, cpus=cpus)
        for (batch, seq), entry in found.items():
            timed_equal.append(f"{batch}x{seq} {'equal' if entry['same_timed'] else 'not equal'}")
            add(row(f"train bf16 {batch}x{seq} tok/s", entry["tok_s"], entry["spread"], ">= 0.98", entry["same"],
                    ratio=entry["ratio"]))
            add(row(f"peak mem train {batch}x{seq} MiB", {s: b / 2**20 for s, b in entry["peaks"].items()},
                    (None, None), "<= 1.01", None))
        pinned = f"; both processes of a pair pinned to CPUs {cpus}" if cpus else ""
        exact = "" if args.native_only else "exact = losses bitwise equal with deterministic algorithms on both sides; "
        notes.append(("native-only: both columns are native CUDA; " if args.native_only else "")
                     + f"train rows: {args.pairs} pairs of side processes, ratio = geometric mean of the medians of the pairs "
                     + "with each side first, spread = quartiles of the per-pair ratios"
                     + f"{pinned}; {exact}losses of the timed passes (default kernels): " + ", ".join(timed_equal))
    if args.native_only or args.train_only:
        report(rows, args.json, *notes)
        return
    models = {side: qwen3_06b.build(side, torch.bfloat16).eval() for side in SIDES}
    prompt = qwen3_06b.batches(1, 1, 16)[0]
    tok_s, spread, same = bench_decode(models, prompt, args.rounds, 64)
    add(row("decode bs1 64 tokens tok/s", tok_s, spread, ">= 0.97", same))
    tok_s, spread, same = bench_decode_steps(models, prompt, args.step_rounds, 64)
    add(row("decode, sides alternate per token", tok_s, spread, ">= 0.97", same))
    tok_s, spread, same, same_dynamic = bench_decode_graphed(models, prompt, args.rounds, 64)
    add(row("decode bs1 64 tok graph tok/s", tok_s, spread, "-", same))
    del models
    torch.cuda.empty_cache()

    notes.append(f"decode rows: {args.rounds} timed rounds of generate (graph row too), {args.step_rounds} of the "
                 "per-token row: greedy with the dynamic cache, one forward per token, no generate loop around it")
    notes.append("graph row: flagos replays a CUDA graph per token, native runs eager generate; exact compares "
                 "with native generate on the same static cache; with the timed native (dynamic cache) tokens: "
                 + ("equal" if same_dynamic else "not equal"))
    report(rows, args.json, *notes)


def report(rows, json_path, *notes):
    """The table, notes under it, and the rows as JSON if asked."""
    print(f"\nQwen3-0.6B, {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'measure':34s} {'native':>10s} {'flagos':>10s} {'ratio':>7s} {'spread q1-q3':>13s} {'target':>8s}  exact")
    for r in rows:
        exact = "-" if r["exact"] is None else ("yes" if r["exact"] else "NO")
        q1, q3 = r["spread"]
        spread = "-" if q1 is None else f"{q1:.3f}-{q3:.3f}"
        print(f"{r['measure']:34s} {r['native']:10.1f} {r['flagos']:10.1f} {r['ratio']:7.3f} {spread:>13s} "
              f"{r['target']:>8s}  {exact}")
    for note in notes:
        print(note)
    if json_path:
        with open(json_path, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
