"""scaled_dot_product_attention on flagos against native CUDA, piece by piece,
at a decode shape (GPU, cuda runtime).

    python benchmarks/bench_sdpa_paths.py [--calls N] [--rounds N]

Prints which fused kernel each side's SDPA chooses (for the decode shape and a
128-token causal training shape), whether the two sides' outputs are bitwise
equal, then host time per call of:
- the whole SDPA call (one query token, 16 heads over 8 KV heads, 64 cached
  tokens, bf16, enable_gqa=True), as a model's decode step makes it;
- the kernel choice alone (`_fused_sdp_choice`);
- CUDA's flash overload, against flagos's way to it when SDPA chooses flash
  (the CPU-named overload, served by flagos-cuda's boxed `cuda_flash`
  provider), and against the same CUDA overload called on flagos (the typed
  relabel path); these take 16 KV heads;
- `add`, for scale.
Each row: medians of interleaved blocks of back-to-back calls, the side that
goes first alternating, the GPU synchronised around each block.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_host_overhead import time_calls  # noqa: E402

BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def block_us(fn, calls):
    """Microseconds per call over one block, the GPU synchronised around it
    (both sides run on the one GPU: CUDA's synchronize serves them alike)."""
    return time_calls(fn, None, calls, lambda _: torch.cuda.synchronize(), time.perf_counter) * 1e6


def choice(q, k, **kw):
    return BACKENDS.get(int(torch._fused_sdp_choice(q, k, k, **kw)), "unknown")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed block")
    parser.add_argument("--rounds", type=int, default=11, help="timed blocks per side and row")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_sdpa_paths: needs a CUDA GPU (and flagos on the cuda runtime)")
        return 1
    import flagos_core  # noqa: F401

    aten = torch.ops.aten
    torch.manual_seed(0)
    q = torch.randn(1, 16, 1, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(1, 8, 64, 128, dtype=torch.bfloat16, device="cuda")
    q_train = torch.randn(1, 16, 128, 128, dtype=torch.bfloat16, device="cuda")
    k_train = torch.randn(1, 8, 128, 128, dtype=torch.bfloat16, device="cuda")
    kv16 = torch.randn(1, 16, 64, 128, dtype=torch.bfloat16, device="cuda")
    f = {name: t.to("flagos") for name, t in (("q", q), ("kv", kv), ("q_train", q_train), ("k_train", k_train),
                                             ("kv16", kv16))}

    print(f"{time.strftime('%Y-%m-%d %H:%M')}  torch {torch.__version__}  {torch.cuda.get_device_name()}")
    for side, (sq, skv, sqt, skt) in (("cuda", (q, kv, q_train, k_train)),
                                       ("flagos", (f["q"], f["kv"], f["q_train"], f["k_train"]))):
        print(f"{side}: decode shape chooses {choice(sq, skv, enable_gqa=True)}, 128-token causal shape chooses "
              f"{choice(sqt, skt, is_causal=True, enable_gqa=True)}")
    with torch.no_grad():
        same = torch.equal(F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True),
                           F.scaled_dot_product_attention(f["q"], f["kv"], f["kv"], enable_gqa=True).cpu().cuda())
    print(f"SDPA outputs bitwise equal: {same}")

    rows = {
        "sdpa, decode shape": (lambda: F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True),
                               lambda: F.scaled_dot_product_attention(f["q"], f["kv"], f["kv"], enable_gqa=True)),
        "_fused_sdp_choice": (lambda: torch._fused_sdp_choice(q, kv, kv, enable_gqa=True),
                              lambda: torch._fused_sdp_choice(f["q"], f["kv"], f["kv"], enable_gqa=True)),
        "flash / _for_cpu (cuda_flash)": (
            lambda: aten._scaled_dot_product_flash_attention(q, kv16, kv16),
            lambda: aten._scaled_dot_product_flash_attention_for_cpu(f["q"], f["kv16"], f["kv16"])),
        "flash / flash (relabel)": (
            lambda: aten._scaled_dot_product_flash_attention(q, kv16, kv16),
            lambda: aten._scaled_dot_product_flash_attention(f["q"], f["kv16"], f["kv16"])),
        "add": (lambda: torch.add(q, q), lambda: torch.add(f["q"], f["q"])),
    }
    print(f"{'call (native / flagos)':<32}{'native us':>11}{'flagos us':>11}{'extra us':>10}{'ratio':>8}")
    with torch.no_grad():
        for name, sides in rows.items():
            for fn in sides:  # warm-up: caches, allocator, lazy init
                block_us(fn, args.calls // 4)
            samples = ([], [])
            for r in range(args.rounds):
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    samples[i].append(block_us(sides[i], args.calls))
            native, flagos = (statistics.median(s) for s in samples)
            print(f"{name:<32}{native:>11.2f}{flagos:>11.2f}{flagos - native:>+10.2f}{flagos / native:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
