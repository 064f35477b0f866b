"""Train and decode a tiny Qwen3 on flagos and on the native device, side by side.

    python -m flagos_core.demo             # flagos vs native (cpu, or cuda on the cuda runtime)
    python -m flagos_core.demo --native-only   # native vs itself: no flagos needed, shows noise

Both sides start from the same weights and see the same batches, so where flagos
routes to the same kernels as the native device the losses, the trained weights
and the generated tokens must be bitwise identical. The exit code is nonzero when
they are not. The functions are importable so tests and benchmarks reuse them.
"""

import argparse
import collections
import statistics
import sys
import time

import torch

SEED = 1234
VOCAB = 512


# ---------------------------------------------------------------- devices


def flagos_runtime_name():
    import flagos_core  # imported late so --native-only runs without the core built

    return flagos_core.runtime()["name"]


def native_device_for(runtime_name):
    """The device whose kernels flagos runs: cuda for the cuda runtime, else the host."""
    if runtime_name == "cuda" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def synchronize(device):
    # torch.cpu, torch.cuda and torch.flagos all have synchronize(); a clock read
    # before it would time only the launches on an asynchronous device.
    module = getattr(torch, torch.device(device).type, None)
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize()


# ---------------------------------------------------------------- model and data


def tiny_qwen3_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
        # Wider than the default 0.02 so the logits are far from uniform and greedy
        # decode gives varied tokens, a stricter parity check than one repeated id.
        initializer_range=0.2,
    )


def build_model(device, seed=SEED):
    """Same seed -> same weights on every device: initialise on the host, then move,
    so the result does not depend on each device's random generator."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_qwen3_config())
    return model.to(device)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)


def make_batches(steps, batch=2, seq=32, seed=SEED):
    """Random token batches on the host; each side moves its own copy."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, seq), generator=gen) for _ in range(steps)]


# ---------------------------------------------------------------- training and decoding


def train_step(model, optimizer, batch):
    """One AdamW step on a causal-LM loss; returns the loss as a Python float."""
    model.train()
    ids = batch.to(next(model.parameters()).device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def train_steps(model, optimizer, batches):
    return [train_step(model, optimizer, b) for b in batches]


def greedy_tokens(model, prompt, new_tokens=16):
    """Greedy decode through HF generate; returns the generated ids on the host."""
    model.eval()
    device = next(model.parameters()).device
    ids = prompt.to(device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,  # random weights: never stop early, so lengths match
        )
    return out[:, ids.shape[1]:].cpu()


def weights_tied(model):
    """Qwen3 here ties lm_head to the embeddings; Module.to must keep them one tensor,
    or the two copies train apart and the parity check fails for a reason
    unrelated to kernels."""
    return model.lm_head.weight is model.model.embed_tokens.weight


def params_equal(model_a, model_b):
    """Names of parameters that differ bitwise (empty list: all equal)."""
    b_params = dict(model_b.named_parameters())
    return [
        name
        for name, p in model_a.named_parameters()
        if not torch.equal(p.detach().cpu(), b_params[name].detach().cpu())
    ]


def time_training(sides, batches, rounds, steps_per_block, clock=time.perf_counter):
    """Interleaved timing: for each round, a block of steps per side in turn
    (the first side alternates between rounds).

    sides: {label: (model, optimizer)}. Every side sees the same batches in the
    same order, so the losses stay comparable. Returns
    {label: {"step_s": [median-per-block seconds per step, ...], "losses": [...]}}.
    `clock` reads seconds (wall time by default).
    """
    result = {label: {"step_s": [], "losses": []} for label in sides}
    it = 0
    in_order = list(sides.items())
    for r in range(rounds):
        block = [batches[(it + i) % len(batches)] for i in range(steps_per_block)]
        it += steps_per_block
        # Which side goes first alternates: on a small machine the second of
        # two back-to-back blocks often runs faster.
        for label, (model, opt) in (in_order if r % 2 == 0 else in_order[::-1]):
            device = next(model.parameters()).device
            synchronize(device)
            t0 = clock()
            losses = train_steps(model, opt, block)
            synchronize(device)
            result[label]["step_s"].append((clock() - t0) / steps_per_block)
            result[label]["losses"] += losses
    return result


# ---------------------------------------------------------------- tracing


class _NoTrace:
    """Stand-in for flagos_core.trace() when there is no flagos side."""

    counts = {}
    fallbacks = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def trace_context(enabled):
    if not enabled:
        return _NoTrace()
    import flagos_core

    return flagos_core.trace()


def provider_summary(counts):
    """{(overload, provider): calls} -> {provider: (distinct overloads, calls)}."""
    ops = collections.defaultdict(set)
    calls = collections.Counter()
    for (overload, provider), n in counts.items():
        ops[provider].add(overload)
        calls[provider] += n
    return {p: (len(ops[p]), calls[p]) for p in sorted(calls, key=lambda p: -calls[p])}


# ---------------------------------------------------------------- the demo


def run_demo(steps=5, new_tokens=16, rounds=5, steps_per_block=2, native_only=False):
    if native_only:
        runtime = "native-only"
        native = flagos = torch.device("cpu")
    else:
        runtime = flagos_runtime_name()
        native, flagos = native_device_for(runtime), torch.device("flagos")

    batches = make_batches(steps)
    prompt = make_batches(1, batch=1, seq=8, seed=SEED + 1)[0]

    # Parity run: native side, then the flagos side under a trace so every call
    # it makes is counted by provider.
    m_native = build_model(native)
    o_native = make_optimizer(m_native)
    loss_native = train_steps(m_native, o_native, batches)
    tok_native = greedy_tokens(m_native, prompt, new_tokens)

    m_flagos = build_model(flagos)
    o_flagos = make_optimizer(m_flagos)
    with trace_context(not native_only) as t:
        loss_flagos = train_steps(m_flagos, o_flagos, batches)
        tok_flagos = greedy_tokens(m_flagos, prompt, new_tokens)
        synchronize(flagos)
    counts, fallbacks = dict(t.counts), sorted(set(t.fallbacks))

    tied = {"native": weights_tied(m_native), "flagos": weights_tied(m_flagos)}
    differing = params_equal(m_native, m_flagos)
    tokens_same = torch.equal(tok_native, tok_flagos)

    # Speed: untraced, interleaved blocks of training steps on the warm models.
    timing = time_training(
        {"native": (m_native, o_native), "flagos": (m_flagos, o_flagos)},
        batches, rounds, steps_per_block,
    )
    timed_same = timing["native"]["losses"] == timing["flagos"]["losses"]
    t_native = statistics.median(timing["native"]["step_s"])
    t_flagos = statistics.median(timing["flagos"]["step_s"])

    return {
        "runtime": runtime,
        "native_device": str(native),
        "flagos_device": str(flagos),
        "loss_native": loss_native,
        "loss_flagos": loss_flagos,
        "losses_equal": loss_native == loss_flagos and timed_same,
        "params_differing": differing,
        "weights_tied": tied,
        "tokens_native": tok_native[0].tolist(),
        "tokens_flagos": tok_flagos[0].tolist(),
        "tokens_equal": tokens_same,
        "step_s_native": t_native,
        "step_s_flagos": t_flagos,
        "speed_ratio": t_native / t_flagos,  # flagos's speed over native's, as the benchmarks print
        "timed_steps_per_side": rounds * steps_per_block,
        "counts": counts,
        "fallbacks": fallbacks,
    }


def _yes(ok):
    return "yes" if ok else "NO"


def print_report(r):
    print(f"runtime: {r['runtime']}   native: {r['native_device']}   flagos: {r['flagos_device']}")
    print()
    print(f"{'step':>4}  {'native loss':>20}  {'flagos loss':>20}  equal")
    for i, (a, b) in enumerate(zip(r["loss_native"], r["loss_flagos"])):
        print(f"{i:>4}  {a:>20.17g}  {b:>20.17g}  {_yes(a == b)}")
    print()
    print(f"native tokens: {r['tokens_native']}")
    print(f"flagos tokens: {r['tokens_flagos']}")
    if r["params_differing"]:
        names = r["params_differing"]
        more = f" and {len(names) - 4} more" if len(names) > 4 else ""
        print(f"parameters that differ: {', '.join(names[:4])}{more}")
    print()

    # The summary table comes last so it is what a reader sees first in a terminal.
    n_params = "all equal" if not r["params_differing"] else f"{len(r['params_differing'])} differ"
    rows = [
        ("losses bitwise equal", _yes(r["losses_equal"])),
        ("parameters after training", n_params),
        ("generated tokens equal", _yes(r["tokens_equal"])),
        ("lm_head tied after .to()", f"native {_yes(r['weights_tied']['native'])}, "
                                     f"flagos {_yes(r['weights_tied']['flagos'])}"),
        ("train step, native", f"{r['step_s_native'] * 1e3:.2f} ms"),
        ("train step, flagos", f"{r['step_s_flagos'] * 1e3:.2f} ms"),
        ("speed ratio flagos/native", f"{r['speed_ratio']:.3f}  (median of {r['timed_steps_per_side']} interleaved steps)"),
    ]
    summary = provider_summary(r["counts"])
    for provider, (n_ops, n_calls) in summary.items():
        rows.append((f"provider {provider}", f"{n_calls} calls, {n_ops} overloads"))
    if not summary:
        rows.append(("providers", "no trace (native-only)" if r["runtime"] == "native-only" else "trace empty"))
    rows.append(("cpu_fallback overloads", ", ".join(r["fallbacks"]) or "none"))

    width = max(len(k) for k, _ in rows)
    print("=" * (width + 40))
    print("flagos demo summary")
    print("-" * (width + 40))
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("=" * (width + 40))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps in the parity run")
    parser.add_argument("--tokens", type=int, default=16, help="greedy tokens to generate")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--native-only", action="store_true",
                        help="compare the native device with itself (no flagos needed)")
    args = parser.parse_args(argv)

    result = run_demo(args.steps, args.tokens, args.rounds, native_only=args.native_only)
    print_report(result)
    ok = result["losses_equal"] and not result["params_differing"] and result["tokens_equal"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
