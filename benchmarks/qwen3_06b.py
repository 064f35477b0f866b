"""Qwen3-0.6B (published sizes, random init, no download) on a given device:
the model, a training step and greedy decoding (generate, and a static-cache
loop that can replay one decode step as a CUDA graph), shared by the GPU
parity tests and the GPU benchmark."""

import copy
import inspect
import time

import torch


# A tiny Qwen3 for checks on CPU: config(**TINY), build(..., **TINY). The wide
# init keeps logits far from uniform, so greedy tokens vary.
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=1000, max_position_embeddings=256, initializer_range=0.2)


def config(**overrides):
    """Qwen3-0.6B's published sizes; keyword arguments override any field."""
    from transformers import Qwen3Config

    fields = dict(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096,
        attn_implementation="sdpa")
    fields.update(overrides)
    return Qwen3Config(**fields)


# CPU models as initialised, per (dtype, seed, overrides), for this process.
_initialised = {}


def build(device, dtype, seed=0, **overrides):
    """A random-init Qwen3 in `dtype` on `device`, the same weights on every
    device (initialised on CPU). The CPU model is made once per process and
    copied for each call: initialising 0.6B parameters takes seconds, and the
    benchmarks and tests build the same model many times."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    key = (dtype, seed, tuple(sorted(overrides.items())))
    if key not in _initialised:
        _initialised[key] = Qwen3ForCausalLM(config(**overrides)).to(dtype)
    return copy.deepcopy(_initialised[key]).to(device)


def save_initialised(path, dtype, seed=0, **overrides):
    """Writes build()'s CPU model to `path`, for processes that load it
    (load_initialised) instead of initialising their own."""
    torch.save(build("cpu", dtype, seed, **overrides), path)


def load_initialised(path, device):
    """The model save_initialised wrote, on `device`: the same weights as
    build() in a second or two (the file is mapped, not read)."""
    return torch.load(path, mmap=True, weights_only=False).to(device)


def batches(steps, batch, seq, seed=1, vocab=151936):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(steps)]


def train(model, data, device, lr=1e-4):
    """Loss of each step, as Python floats."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    losses = []
    for ids in data:
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@torch.no_grad()
def greedy(model, prompt, new_tokens, device, static_cache=False):
    """Greedy tokens of model.generate. static_cache=True decodes with the same
    StaticCache as greedy_graphed, so both attend over the same padded,
    masked cache and run the same kernels (the default dynamic cache attends
    over the grown length without a mask: other kernels, other rounding)."""
    kwargs = {}
    if static_cache:
        kwargs[_cache_kwarg(model)] = make_static_cache(model, prompt.shape[1] + new_tokens, device)
        # On CUDA generate torch.compiles the forward for a static cache:
        # other kernels. Stay eager.
        if hasattr(model.generation_config, "disable_compile"):
            kwargs["disable_compile"] = True
    out = model.generate(
        prompt.to(device), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        pad_token_id=0, eos_token_id=None, **kwargs)
    return out[0, prompt.shape[1]:].cpu()


def _cache_kwarg(model):
    # transformers 5.x renamed the forward's past_key_values to cache (the old
    # name still works there, with a deprecation warning).
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _decode_kwargs(model):
    """Keyword arguments of a decode step's forward, as generate passes them:
    use the cache, and run lm_head on the last position only where the
    model's forward can."""
    kwargs = {"use_cache": True}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1
    return kwargs


def make_static_cache(model, max_cache_len, device):
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kwargs = dict(config=model.config, max_cache_len=max_cache_len)
    if "dtype" in params:  # older transformers allocate up front and need these
        kwargs.update(max_batch_size=1, device=torch.device(device), dtype=model.dtype)
    return StaticCache(**kwargs)


class GreedySteps:
    """Greedy decoding (batch 1) one token per call of step(), with the
    model's default dynamic KV cache as generate keeps it: lets a benchmark
    alternate two devices token by token. The prompt is prefilled at
    construction; tokens() returns the new tokens on the CPU."""

    @torch.no_grad()
    def __init__(self, model, prompt, device):
        self.model = model
        self.extra = _decode_kwargs(model)
        self.cache_kwarg = _cache_kwarg(model)
        self.cache = None
        self.produced = []
        self.next = self._forward(prompt.to(device))

    def _forward(self, ids):
        kwargs = dict(self.extra)
        if self.cache is not None:
            kwargs[self.cache_kwarg] = self.cache
        out = self.model(input_ids=ids, **kwargs)
        # The output names the cache as the forward does (past_key_values, or cache in transformers 5.x).
        self.cache = out["cache"] if "cache" in out else out["past_key_values"]
        return out.logits[:, -1:, :].argmax(-1)  # (1, 1), stays on the device

    @torch.no_grad()
    def step(self):
        self.produced.append(self.next)
        self.next = self._forward(self.next)

    def tokens(self):
        return torch.cat(self.produced, dim=1)[0].cpu()


@torch.no_grad()
def greedy_graphed(model, prompt, new_tokens, device, use_graph=True, warmup=3):
    """Greedy tokens (batch 1) with a static KV cache: prefill eagerly, then
    decode one token per step. With use_graph, the first `warmup` steps run
    eagerly on a side stream, one step is captured as a CUDA graph and the
    rest replay it; use_graph=False runs every step eagerly (any device).

    A step reads the static buffers ids and pos and writes the next token
    into out; between steps out is copied into ids and pos is advanced, on
    the device, so nothing waits on the host until the tokens are returned."""
    device = torch.device(device)
    length = prompt.shape[1]
    cache = make_static_cache(model, length + new_tokens, device)
    params = inspect.signature(model.forward).parameters
    kwargs = {_cache_kwarg(model): cache, **_decode_kwargs(model)}
    # Older transformers index the static cache by cache_position; 5.x
    # counts the cached length itself (a device tensor, advanced in place).
    pass_cache_position = "cache_position" in params

    def forward(ids, pos):
        extra = {"cache_position": pos[0]} if pass_cache_position else {}
        logits = model(input_ids=ids, position_ids=pos, **kwargs, **extra).logits
        return logits[:, -1, :].argmax(-1, keepdim=True)  # (1, 1)

    tokens = torch.empty(new_tokens, dtype=torch.long, device=device)
    ids = forward(prompt.to(device), torch.arange(length, device=device).unsqueeze(0))
    pos = torch.full((1, 1), length, dtype=torch.long, device=device)
    tokens[0:1].copy_(ids[0])

    def advance(out, i):
        tokens[i:i + 1].copy_(out[0])
        ids.copy_(out)
        pos.add_(1)

    i = 1
    if use_graph and new_tokens > 1:
        # flagos kernels are CUDA kernels on the current CUDA stream; the
        # flagos names are torch.cuda's graph, CUDAGraph (flagos_cuda/graphs.py).
        module = torch.flagos if device.type == "flagos" else torch.cuda
        # Warm-up steps are real decode steps (they fill the cache), run on a
        # side stream as the CUDA graph docs ask before a capture; at least
        # one step is left for the graph.
        side = module.Stream()
        side.wait_stream(module.current_stream())
        with module.stream(side):
            while i < min(1 + warmup, new_tokens - 1):
                advance(forward(ids, pos), i)
                i += 1
        module.current_stream().wait_stream(side)
        # Capture records the kernels without running them: the cache and
        # its length stay as the warm-up left them.
        g = module.CUDAGraph()
        with module.graph(g):
            out = forward(ids, pos)
        while i < new_tokens:
            g.replay()
            advance(out, i)
            i += 1
    while i < new_tokens:
        advance(forward(ids, pos), i)
        i += 1
    return tokens.cpu()


class Trainer:
    """One model and optimizer, trained block by block."""

    def __init__(self, device, dtype, batch, seq, steps_per_block, blocks, seed=1, model_path=None):
        self.device = device
        self.module = getattr(torch, torch.device(device).type)  # torch.cuda, torch.flagos, torch.cpu
        self.model = build(device, dtype) if model_path is None else load_initialised(model_path, device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=True)
        self.data = batches(steps_per_block * blocks, batch, seq, seed=seed, vocab=self.model.config.vocab_size)
        self.steps = steps_per_block

    def block(self, index):
        """(seconds, losses) of steps_per_block training steps."""
        self.module.synchronize()
        start = time.perf_counter()
        losses = []
        for ids in self.data[index * self.steps:(index + 1) * self.steps]:
            ids = ids.to(self.device)
            loss = self.model(input_ids=ids, labels=ids).loss
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        self.module.synchronize()
        return time.perf_counter() - start, [l.item() for l in losses]

    def device_work(self, index):
        """One more block under torch.profiler, device activity only: {"kernels":
        {name: [launches, device microseconds]}} for the device's kernels,
        copies and sets. What the GPU ran, to compare between sides; the
        profiler's own cost makes this block's wall time meaningless."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            self.block(index)
        kernels = {}
        for event in prof.events():
            # With a PrivateUse1 backend registered (flagos), PyTorch labels
            # every GPU activity as that backend's: count both labels.
            if event.device_type in (DeviceType.CUDA, DeviceType.PrivateUse1):
                entry = kernels.setdefault(event.name, [0, 0.0])
                entry[0] += 1
                entry[1] += event.time_range.elapsed_us()
        return {"kernels": kernels}

    def peak_bytes(self, index):
        """Peak memory of one more block above what is resident before it
        (0 on a device without memory statistics, the CPU)."""
        if not hasattr(self.module, "max_memory_allocated"):
            return 0
        self.module.synchronize()
        self.module.reset_peak_memory_stats()
        base = self.module.memory_allocated()
        self.block(index)
        return self.module.max_memory_allocated() - base

    def close(self):
        del self.model, self.opt
        if hasattr(self.module, "empty_cache"):
            self.module.empty_cache()
