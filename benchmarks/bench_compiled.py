"""torch.compile (inductor, the default backend): a compiled Qwen3 training
step on flagos against the same on the native device, each side in a fresh
process of its own.

    python benchmarks/bench_compiled.py [--pairs 2] [--steps 20] [--tiny]

flagos hands inductor its graphs for the native device (flagos_core/_inductor.py),
so both sides should run the same generated code: the ratio measures what
flagos adds around it (a native alias per argument, a flagos tensor per
result, per compiled graph call). Each process compiles the model, runs
three warm-up steps, then times `--steps` steps (median of blocks of 5,
synchronised); sides alternate which goes first, pair by pair. On a GPU: a
Qwen3 with the 0.6B's widths and 4 layers, bf16, batch 4 x 512; `--tiny` (and
on the host runtime always): the tests' tiny Qwen3 in float32, batch 2 x 32.
Also says whether the two sides' losses are bitwise equal.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, statistics, sys, time
device, steps, tiny = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
if device == "flagos":
    import flagos_core  # noqa: F401
import torch
sys.path.insert(0, os.environ["FLAGOS_BENCHMARKS"])
from compiled_qwen3 import build

model, vocab, (batch, seq) = build("tiny" if tiny else "bench", device)
step_fn = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
ids = torch.randint(0, vocab, (steps + 3, batch, seq), generator=torch.Generator().manual_seed(0))
sync = getattr(torch, "flagos" if device == "flagos" else device, None)

def step(batch_ids):
    loss = step_fn(input_ids=batch_ids, labels=batch_ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss

start = time.perf_counter()
losses = [step(ids[i].to(device)).item() for i in range(3)]
compile_s = time.perf_counter() - start
blocks = []
for b in range(0, steps, 5):
    batches = [ids[3 + i].to(device) for i in range(b, min(b + 5, steps))]
    if hasattr(sync, "synchronize"):
        sync.synchronize()
    t = time.perf_counter()
    for x in batches:
        loss = step(x)
    losses.append(loss.item())  # synchronises
    blocks.append((time.perf_counter() - t) / len(batches))
print(json.dumps({"step_s": statistics.median(blocks), "compile_s": compile_s, "losses": losses,
                  "tokens": batch * seq}))
"""


def run_side(device, steps, tiny):
    env = dict(os.environ, FLAGOS_BENCHMARKS=os.path.dirname(os.path.abspath(__file__)))
    if device != "flagos":  # a native backward cannot run where flagos is registered
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    out = subprocess.run([sys.executable, "-c", CHILD, device, str(steps), "1" if tiny else "0"],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{device} side failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    import flagos_core

    native = "cpu" if flagos_core.runtime()["name"] == "host" else flagos_core.runtime()["name"]
    tiny = args.tiny or native == "cpu"
    results = {native: [], "flagos": []}
    ratios = []
    for p in range(args.pairs):
        order = (native, "flagos") if p % 2 == 0 else ("flagos", native)
        pair = {side: run_side(side, args.steps, tiny) for side in order}
        for side in order:
            results[side].append(pair[side])
        ratios.append(pair[native]["step_s"] / pair["flagos"]["step_s"])
        compiles = ", ".join(f"{side} {pair[side]['compile_s']:.1f}" for side in order)
        print(f"  pair {p + 1}/{args.pairs} ({order[0]} first): {ratios[-1]:.3f}; compile+3 steps s: {compiles}",
              flush=True)
    tokens = results[native][0]["tokens"]
    rate = {side: statistics.median(tokens / r["step_s"] for r in rs) for side, rs in results.items()}
    compile_s = {side: statistics.median(r["compile_s"] for r in rs) for side, rs in results.items()}
    same = all(a["losses"] == b["losses"] for a, b in zip(results[native], results["flagos"]))
    ratio = statistics.median(ratios)
    print(f"compiled Qwen3 training ({'tiny, float32' if tiny else '0.6B widths, 4 layers, bf16'}), "
          f"{args.pairs} pairs of processes, {args.steps} timed steps each")
    print(f"{'side':8} {'tok/s':>10} {'compile+3 steps s':>18}")
    for side in (native, "flagos"):
        print(f"{side:8} {rate[side]:10.1f} {compile_s[side]:18.1f}")
    print(f"ratio flagos/{native} (tok/s, median of pairs): {ratio:.3f}; losses bitwise equal: {'yes' if same else 'no'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ratio": ratio, "rates": rate, "compile_s": compile_s, "same_losses": same,
                       "pair_ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
