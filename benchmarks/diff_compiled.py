"""Where a torch.compile'd (inductor) training run on flagos differs from the
same run on the native device: each side in a fresh process of its own
(a native backward cannot run where flagos is registered), then compared.

    python benchmarks/diff_compiled.py [--size tiny|bench] [--steps 3] [--deterministic] [--out DIR]

Each side compiles a Qwen3 (`tiny`: the tests' float32 model, batch 2 x 32;
`bench`: bench_compiled.py's 0.6B widths, 4 layers, bf16, batch 4 x 512) and
trains `--steps` AdamW steps, recording
- each graph inductor lowers (forward, backward), as its inner compiler gets
  it: on flagos, the graph already moved to the native device;
- the code inductor generates for each (its caches off, so it generates);
- the losses and the parameters after the last step;
- five more steps timed, then one under the profiler: host time by entry
  and (on a GPU) kernels run and their time.
Then prints what differs: graphs and code as unified diffs (the first lines
of each), which results differ and by how much, step times, and the host
and kernel tables side by side. flagos hands inductor its graphs for the native device, so every
difference here is one to explain.
"""

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time
device, size, steps, out, deterministic = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
if device == "flagos":
    import flagos_core  # noqa: F401
import torch
torch.use_deterministic_algorithms(deterministic)
from torch._inductor import compile_fx as inductor_compile
from torch._inductor.graph import GraphLowering

graphs, codes = [], []
lower = inductor_compile._compile_fx_inner

def recording_lower(gm, example_inputs, **kwargs):
    graphs.append(gm.print_readable(print_output=False, include_stride=True, include_device=True))
    return lower(gm, example_inputs, **kwargs)

inductor_compile._compile_fx_inner = recording_lower
GraphLowering.save_output_code = staticmethod(codes.append)

sys.path.insert(0, os.environ["FLAGOS_BENCHMARKS"])
from compiled_qwen3 import build

model, vocab, (batch, seq) = build(size, device)
step_fn = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
ids = torch.randint(0, vocab, (steps + 1, batch, seq), generator=torch.Generator().manual_seed(0))

def step(x):
    loss = step_fn(input_ids=x, labels=x).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()

losses = [step(ids[i].to(device)) for i in range(steps)]
torch.save({"losses": [l.cpu() for l in losses], "params": {n: p.detach().cpu() for n, p in model.named_parameters()}},
           os.path.join(out, device + ".pt"))
from torch.profiler import ProfilerActivity, profile
gpu = torch.cuda.is_available()
sync = torch.cuda.synchronize if gpu else (lambda: None)
x = ids[steps].to(device)
sync()
start = time.perf_counter()
for _ in range(5):
    step(x)
sync()
step_ms = (time.perf_counter() - start) / 5 * 1e3
with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])) as prof:
    step(x)
    sync()
kernels, host = {}, {}
for e in prof.key_averages():
    if getattr(e, "is_user_annotation", False):  # the optimizer's step, say: on both timelines
        continue
    if e.device_time_total > 0 and e.self_cpu_time_total == 0:
        kernels[e.key] = [e.count, e.device_time_total]
    elif e.self_cpu_time_total > 0:
        host[e.key] = [e.count, e.self_cpu_time_total]
with open(os.path.join(out, device + ".json"), "w") as f:
    json.dump({"graphs": graphs, "codes": codes, "kernels": kernels, "host": host, "step_ms": step_ms}, f)
"""


def run_side(device, args, out):
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
               FLAGOS_BENCHMARKS=os.path.dirname(os.path.abspath(__file__)))
    if device != "flagos":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    done = subprocess.run([sys.executable, "-c", CHILD, device, args.size, str(args.steps), out,
                           "1" if args.deterministic else "0"],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the {device} side failed:\n{done.stderr[-4000:]}")
    with open(os.path.join(out, device + ".json")) as f:
        return json.load(f)


def without_kernel_paths(code):
    # Each side's code names its kernels' files in a cache folder of its own.
    return "\n".join(line for line in code.splitlines() if not line.startswith("# kernel path: "))


def show_diffs(what, native, flagos, native_name, lines):
    print(f"{what}: {len(native)} on {native_name}, {len(flagos)} on flagos")
    for i, (a, b) in enumerate(zip(native, flagos)):
        if a == b:
            print(f"  {what} {i}: identical")
            continue
        diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), native_name, "flagos", n=1, lineterm=""))
        print(f"  {what} {i}: {sum(1 for d in diff if d[:1] in '+-') - 2} lines differ; the first {lines}:")
        print("\n".join("    " + d[:200] for d in diff[:lines]))


def compare_results(out, native_name):
    import torch

    native, flagos = (torch.load(os.path.join(out, side + ".pt")) for side in (native_name, "flagos"))
    for i, (a, b) in enumerate(zip(native["losses"], flagos["losses"])):
        print(f"loss {i}: {native_name} {a.item()!r}, flagos {b.item()!r}{'' if torch.equal(a, b) else '  DIFFERS'}")
    differing = [(name, (p.float() - flagos["params"][name].float()).abs().max().item())
                 for name, p in native["params"].items() if not torch.equal(p, flagos["params"][name])]
    print(f"parameters after the last step: {len(native['params']) - len(differing)} of {len(native['params'])} "
          "bitwise equal")
    for name, worst in differing[:20]:
        print(f"  {name}: max abs difference {worst:.3g}")


def compare_host(native, flagos, native_name, top):
    """The profiled step's host time by entry (self CPU time), the largest differences first."""
    a, b = native["host"], flagos["host"]
    print(f"unprofiled step, wall time: {native_name} {native['step_ms']:.2f} ms, flagos {flagos['step_ms']:.2f} ms; "
          f"profiled step, host self time: {native_name} {sum(t for _, t in a.values()) / 1e3:.2f} ms, "
          f"flagos {sum(t for _, t in b.values()) / 1e3:.2f} ms")
    names = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, [0, 0])[1] - a.get(k, [0, 0])[1]))
    print(f"{'host entry':<60}{native_name + ' n':>8}{native_name + ' us':>11}{'flagos n':>9}{'flagos us':>11}")
    for name in names[:top]:
        x, y = a.get(name, [0, 0.0]), b.get(name, [0, 0.0])
        print(f"{name[:58]:<60}{x[0]:>8}{x[1]:>11.1f}{y[0]:>9}{y[1]:>11.1f}")


def compare_kernels(native, flagos, native_name, top):
    if not native:
        return
    total = {side: sum(t for _, t in k.values()) for side, k in ((native_name, native), ("flagos", flagos))}
    print(f"one profiled step, device time: {native_name} {total[native_name] / 1e3:.2f} ms, "
          f"flagos {total['flagos'] / 1e3:.2f} ms")
    names = sorted(set(native) | set(flagos), key=lambda k: -max(native.get(k, [0, 0])[1], flagos.get(k, [0, 0])[1]))
    print(f"{'kernel':<70}{native_name + ' n':>8}{native_name + ' us':>11}{'flagos n':>9}{'flagos us':>11}")
    shown = 0
    for name in names:
        a, b = native.get(name, [0, 0.0]), flagos.get(name, [0, 0.0])
        if shown < top or a[0] != b[0]:
            print(f"{name[:68]:<70}{a[0]:>8}{a[1]:>11.1f}{b[0]:>9}{b[1]:>11.1f}")
            shown += 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("tiny", "bench"), default="tiny")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--deterministic", action="store_true",
                        help="torch.use_deterministic_algorithms on both sides (native CUDA's bf16 run "
                             "is not reproducible against itself without it)")
    parser.add_argument("--lines", type=int, default=40, help="lines of each unified diff shown")
    parser.add_argument("--top", type=int, default=15, help="kernels shown beyond those whose counts differ")
    parser.add_argument("--out", help="where each side leaves its records (default: a temporary folder)")
    args = parser.parse_args(argv)
    import flagos_core

    native_name = "cpu" if flagos_core.runtime()["name"] == "host" else flagos_core.runtime()["name"]
    out = args.out or tempfile.mkdtemp(prefix="flagos-diff-compiled-")
    os.makedirs(out, exist_ok=True)
    native, flagos = run_side(native_name, args, out), run_side("flagos", args, out)
    print(f"compiled Qwen3 training ({args.size}{', deterministic algorithms' if args.deterministic else ''}), "
          f"{args.steps} steps, {native_name} against flagos; records in {out}")
    show_diffs("graph", native["graphs"], flagos["graphs"], native_name, args.lines)
    show_diffs("code", [without_kernel_paths(c) for c in native["codes"]],
               [without_kernel_paths(c) for c in flagos["codes"]], native_name, args.lines)
    compare_results(out, native_name)
    compare_host(native, flagos, native_name, args.top)
    compare_kernels(native["kernels"], flagos["kernels"], native_name, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
