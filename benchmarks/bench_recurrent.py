"""Recurrent layers on flagos against the native device, in one process.

    python benchmarks/bench_recurrent.py [--rounds N]

A 2-layer nn.LSTM and nn.GRU, 256 wide, 32 steps of batch 8, float32:
forward alone (no grad) and forward plus backward. On the host runtime both
take CPU's own decompositions (flagos_core/_host_rnn.py), on the cuda
runtime cuDNN's RNN, as native CUDA does (flagos_cuda's
CudnnRecurrent.cpp). A third column times flagos with PyTorch's own
decomposition for a flagos tensor (the op's CompositeImplicitAutograd
kernel called directly: the fused cells step by step), the path these
layers took before. Interleaved blocks, the side that goes first
alternating; medians per side. On the host runtime the process's CPU time,
pinned to one CPU with one torch thread (as bench_host_overhead.py's
default clock); on a GPU wall time around synchronised blocks, forward only:
PyTorch cannot run a backward over native CUDA tensors in a process that
loaded flagos (pytorch/pytorch#161129), and a fourth column times native
CUDA with its weights unflattened (what flagos's layers ran at before
flatten_parameters() packed flagos weights too, docs/usage.md). Prints
ms per call per side and the speed ratio native/side (1.0 is the native
device's speed).
"""

import argparse
import os
import statistics
import sys
import time

import torch

import flagos_core

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_host_overhead import load_demo, time_calls  # noqa: E402

BLOCK = 5  # calls per timed block


def cases(native, with_backward):
    """(case, [(side, device, fn)]): the native device's layer first."""
    flagos_device = torch.device("flagos")
    for layer in ("LSTM", "GRU"):
        torch.manual_seed(0)
        reference = getattr(torch.nn, layer)(256, 256, num_layers=2)
        flagos = getattr(torch.nn, layer)(256, 256, num_layers=2)
        flagos.load_state_dict(reference.state_dict())
        flagos.to("flagos")
        x = torch.randn(32, 8, 256)
        x_native, x_flagos = x.to(native), x.to("flagos")
        reference.to(native)
        sides = [(native.type, native, reference, x_native, False), ("flagos", flagos_device, flagos, x_flagos, False),
                 ("decomposed", flagos_device, flagos, x_flagos, True)]
        if native.type == "cuda":
            # Native CUDA with its weights out of the one buffer that
            # flatten_parameters() packs them into: cuDNN packs them on
            # every call.
            unflattened = getattr(torch.nn, layer)(256, 256, num_layers=2).to(native)
            unflattened.load_state_dict(reference.state_dict())
            with torch.no_grad():
                for p in unflattened.parameters():
                    p.data = p.data.clone()
            sides.append(("unflattened", native, unflattened, x_native, False))
        yield f"{layer} forward", [(n, d, lambda m=m, x=x, c=c: _forward(m, x, c)) for n, d, m, x, c in sides]
        if with_backward:
            yield f"{layer} forward+backward", [(n, d, lambda m=m, x=x, c=c: _train(m, x, c)) for n, d, m, x, c in sides]


def _decomposition(module, x):
    # The layer's forward as nn.LSTM / nn.GRU make it, through the op's
    # CompositeImplicitAutograd kernel instead of the dispatcher's choice.
    op = torch.ops.aten.lstm.input if isinstance(module, torch.nn.LSTM) else torch.ops.aten.gru.input
    h = torch.zeros(module.num_layers, x.size(1), module.hidden_size, device=x.device)
    hx = [h, torch.zeros_like(h)] if isinstance(module, torch.nn.LSTM) else h
    return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, x, hx, module._flat_weights, module.bias,
                     module.num_layers, 0.0, module.training, False, False)


def _forward(module, x, decomposed=False):
    with torch.no_grad():
        _decomposition(module, x) if decomposed else module(x)


def _train(module, x, decomposed=False):
    module.zero_grad(set_to_none=True)
    (_decomposition(module, x) if decomposed else module(x))[0].sum().backward()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    demo = load_demo()
    native = demo.native_device_for(flagos_core.runtime()["name"])
    if native.type == "cpu":
        os.sched_setaffinity(0, {os.sched_getaffinity(0).pop()})
        torch.set_num_threads(1)
        clock, clock_name = time.process_time, "process CPU time, one CPU, one thread"
    else:
        clock, clock_name = time.perf_counter, "wall time, synchronised blocks"
    print(f"torch {torch.__version__}; native {native}; {args.rounds} rounds x {BLOCK} calls; {clock_name}")
    header = False
    for name, sides in cases(native, with_backward=native.type == "cpu"):
        if not header:
            print(f"{'case':<24}" + "".join(f"{side + ' ms':>16}" for side, _, _ in sides)
                  + "".join(f"{native.type + '/' + side:>20}" for side, _, _ in sides[1:]))
            header = True
        for _, device, fn in sides:  # warm-up
            time_calls(fn, device, BLOCK, demo.synchronize, clock)
        samples = [[] for _ in sides]
        order = list(range(len(sides)))
        for r in range(args.rounds):
            for i in (order if r % 2 == 0 else order[::-1]):  # which side goes first alternates
                samples[i].append(time_calls(sides[i][2], sides[i][1], BLOCK, demo.synchronize, clock))
        ms = [statistics.median(s) * 1e3 for s in samples]
        print(f"{name:<24}" + "".join(f"{m:>16.2f}" for m in ms) + "".join(f"{ms[0] / m:>20.3f}" for m in ms[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
