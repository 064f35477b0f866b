"""The run whose profile the build optimises libflagos_core with (FLAGOS_PGO).

A small decoder-only transformer, written in plain torch so the build needs
nothing beyond torch, trained for a few steps and then decoded greedily with
a KV cache, on flagos's host runtime: the per-call path every provider shares
(aliases, results, the typed kernels of the ops models call most) runs
thousands of times. The build runs this against an instrumented twin of the
library; GCC then lays out the real library's hot paths together and moves
the rarely taken branches aside, which cuts the instruction-cache misses
flagos adds over the native device by about two thirds (docs/performance.md).

    python profile_workload.py    (with the instrumented flagos_core first on PYTHONPATH)
"""

import os
import sys

os.environ["FLAGOS_RUNTIME"] = "host"  # the same shared per-call code on any machine
os.environ["FLAGOS_DISCOVER_PLUGINS"] = "0"  # an installed plugin was built against another core

# An editable install of flagos-core from another checkout (as scripts/ab-core
# makes) puts an import redirect ahead of PYTHONPATH: without this, the run
# would profile that checkout's installed library, not the instrumented twin,
# and leave no profile behind.
sys.meta_path[:] = [
    finder for finder in sys.meta_path
    if "flagos_core" not in getattr(finder, "known_source_files", ())
]

import torch  # noqa: E402

import flagos_core  # noqa: E402

_stage = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
if _stage and not os.path.abspath(flagos_core.__file__).startswith(os.path.abspath(_stage) + os.sep):
    sys.exit(f"profile_workload: imported flagos_core from {flagos_core.__file__}, not from the staged build {_stage}")

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = 256, 64, 4, 2, 16, 128, 2


def rms_norm(x, weight, eps=1e-6):
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps)).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.kv = torch.nn.Linear(HIDDEN, 2 * KV_HEADS * HEAD_DIM, bias=False)
        self.o = torch.nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.gate_up = torch.nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.down = torch.nn.Linear(FFN, HIDDEN, bias=False)
        self.norm1 = torch.nn.Parameter(torch.ones(HIDDEN))
        self.norm2 = torch.nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x, cos, sin, cache):
        batch, seq, _ = x.shape
        h = rms_norm(x, self.norm1)
        q = self.q(h).view(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
        k, v = self.kv(h).view(batch, seq, 2 * KV_HEADS, HEAD_DIM).transpose(1, 2).chunk(2, dim=1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if cache is not None:
            if cache:
                k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
            cache[:] = [k, v]
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=seq > 1)
        x = x + self.o(attn.transpose(1, 2).reshape(batch, seq, -1))
        gate, up = self.gate_up(rms_norm(x, self.norm2)).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(gate) * up)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.Parameter(torch.ones(HIDDEN))

    def forward(self, ids, start=0, caches=None):
        positions = torch.arange(start, start + ids.shape[1], device=ids.device, dtype=torch.float32)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device=ids.device) / HEAD_DIM))
        angles = torch.outer(positions, inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        x = self.embed(ids)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, caches[i] if caches is not None else None)
        return rms_norm(x, self.norm) @ self.embed.weight.t()  # tied head


def main():
    torch.manual_seed(0)
    device = torch.device("flagos")
    model = Model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    for _ in range(6):
        ids = torch.randint(0, VOCAB, (2, 32), device=device)
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    with torch.no_grad():
        for _ in range(3):
            caches = [[] for _ in range(LAYERS)]
            ids = torch.randint(0, VOCAB, (1, 8), device=device)
            logits = model(ids, 0, caches)
            for step in range(64):
                token = logits[:, -1].argmax(-1, keepdim=True)
                logits = model(token, ids.shape[1] + step, caches)
    if not torch.isfinite(logits).all():
        sys.exit("profile workload: non-finite logits")
    print("profile workload done, last training loss", float(loss.detach()))


if __name__ == "__main__":
    main()
