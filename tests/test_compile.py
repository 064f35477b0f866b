"""torch.compile on flagos: the graph-capturing backends run on flagos's
kernels; inductor, the default, compiles flagos graphs for the native device
and gives what it gives native tensors there."""

import copy

import pytest
import torch

import flagos_core
from native_reference import compare_with_native

on_host = pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="compares with CPU in this process")


def make(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)


@on_host
def test_aot_eager_trains_as_eager_cpu_does():
    x = torch.randn(8, 16)
    native = make("cpu")
    want = native(x).pow(2).mean()
    want.backward()
    model = make("flagos")
    with flagos_core.trace() as t:
        loss = torch.compile(model, backend="aot_eager")(x.to("flagos")).pow(2).mean()
        loss.backward()
    assert torch.equal(loss.cpu(), want)
    assert all(torch.equal(f.grad.cpu(), n.grad) for f, n in zip(model.parameters(), native.parameters()))
    assert t.fallbacks == [] and t.by_provider()


def test_attention_traces_with_every_backend():
    # SDPA's kernel choice is asked while dynamo traces, about FakeTensors:
    # it used to stop there (no memory to alias) with every backend.
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 4, 8, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def run(fn):
        args = [t.to("flagos").requires_grad_() for t in (q, k, v)]
        out = fn(*args)
        out.sum().backward()
        return [out.detach()] + [a.grad for a in args]

    eager = run(attend)
    for backend in ("eager", "aot_eager"):
        got = run(torch.compile(attend, backend=backend))
        assert all(torch.equal(g.cpu(), e.cpu()) for g, e in zip(got, eager)), backend


def compiled_qwen3_training(device):
    # A tiny Qwen3 (SDPA attention, tied embeddings) compiled by inductor,
    # three AdamW steps: the losses, then every parameter. Plain torch and
    # transformers: on an accelerator it runs in a process without flagos.
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch._dynamo.reset()
    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, intermediate_size=128, vocab_size=512, tie_word_embeddings=True,
                         attn_implementation="sdpa", initializer_range=0.2)
    model = Qwen3ForCausalLM(config).to(device)
    step = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    batches = torch.randint(0, 512, (3, 2, 32), generator=torch.Generator().manual_seed(0))
    losses = []
    for batch in batches:
        batch = batch.to(device)
        loss = step(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses + [p.detach() for p in model.parameters()]


@pytest.mark.native
def test_inductor_trains_a_model_as_on_the_native_device(tmp_path, native_device):
    compare_with_native(compiled_qwen3_training, native_device, tmp_path)


def _control_flow(device):
    # Self-contained: on an accelerator it runs in a side process. Compiled
    # graphs with subgraphs (torch.cond's branches, while_loop's and map's
    # bodies), inference and a training step through cond.
    from torch._higher_order_ops.map import map as mapped

    torch._dynamo.reset()
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(0)).to(device)
    w = torch.randn(5, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
    results = [
        torch.compile(lambda a: torch.cond(a.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (a,)), fullgraph=True)(x),
        torch.compile(lambda a: torch.while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t.sin()),
                                                 (torch.tensor(0, device=a.device), a))[1], fullgraph=True)(x),
        torch.compile(lambda a: mapped(lambda t: t.sin() + 1, a), fullgraph=True)(x),
    ]
    step = torch.compile(lambda a, w: torch.cond(a.sum() > 0, lambda t, v: (t * v).sin(), lambda t, v: (t * v).cos(),
                                                 (a, w)).sum())
    step(x, w).backward()
    return [r.detach() for r in results] + [w.grad]


@pytest.mark.native
def test_inductor_compiles_control_flow_subgraphs(tmp_path, native_device):
    # The subgraphs' values were left on flagos while the graph moved to the
    # native device, and inductor refused the mismatch.
    compare_with_native(_control_flow, native_device, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_inductor_inference_on_the_gpu_equals_native_cuda(mode, native_device):
    # Inference only (a native backward cannot run beside flagos): the same
    # compiled model on flagos and on native CUDA in one process, three calls
    # each (reduce-overhead records a CUDA graph, then replays it).
    torch._dynamo.reset()
    torch.manual_seed(0)
    native = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.SiLU(), torch.nn.Linear(256, 64)).to(native_device)
    flagos = copy.deepcopy(native).to("flagos")
    native_step, flagos_step = torch.compile(native, mode=mode), torch.compile(flagos, mode=mode)
    with torch.no_grad():
        for i in range(3):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(i))
            want = native_step(x.to(native_device)).clone()
            got = flagos_step(x.to("flagos")).clone()
            assert got.device.type == "flagos"
            assert torch.equal(got.cpu(), want.cpu()), (mode, i)


@on_host
def test_inductor_graphs_match_the_native_devices():
    torch._dynamo.reset()

    def both(fn, *tensors):  # compiled on CPU and on flagos, with the same inputs
        native = torch.compile(fn)(*(copy.deepcopy(t) for t in tensors))
        with flagos_core.trace() as t:
            got = torch.compile(fn)(*(x.to("flagos") for x in tensors))
        assert t.fallbacks == []
        return native, got

    # Several batch sizes: the second recompiles with a dynamic size.
    model = make("cpu")
    flagos_model = make("flagos")
    for rows in (3, 5, 9):
        x = torch.randn(rows, 16)
        assert torch.equal(torch.compile(model)(x), torch.compile(flagos_model)(x.to("flagos")).cpu())

    # Batch norm in training: its running statistics (buffers the graph writes) too.
    torch.manual_seed(0)
    native_bn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    flagos_bn = copy.deepcopy(native_bn).to("flagos")
    x = torch.randn(2, 3, 8, 8)
    want, got = torch.compile(native_bn)(x), torch.compile(flagos_bn)(x.to("flagos"))
    want.sum().backward()
    got.sum().backward()
    assert torch.equal(want, got.cpu())
    for name, value in native_bn.state_dict().items():
        assert torch.equal(value, flagos_bn.state_dict()[name].cpu()), name
    for n, f in zip(native_bn.parameters(), flagos_bn.parameters()):
        assert torch.equal(n.grad, f.grad.cpu())

    # An argument written in place, and a result that is a view of it.
    def bump(a):
        a.add_(1)
        return a[1:], a.sum()

    a = torch.randn(4)
    flagos_a = a.to("flagos")
    want, got = torch.compile(bump)(a), torch.compile(bump)(flagos_a)
    assert torch.equal(flagos_a.cpu(), a)
    assert all(torch.equal(w, g.cpu()) for w, g in zip(want, got))
    assert got[0].device.type == "flagos" and got[0]._base is flagos_a
    got[0].zero_()
    assert flagos_a.cpu()[1:].eq(0).all()

    # CPU and flagos tensors in one graph; a result moved to the CPU stays there.
    want, got = both(lambda c, f: (c.to(f.device) * f, (f * 2).cpu()), torch.randn(3), torch.randn(3))
    assert [t.device.type for t in got] == ["flagos", "cpu"]
    assert torch.equal(want[0], got[0].cpu()) and torch.equal(want[1], got[1])

    # Without autograd.
    with torch.no_grad():
        want, got = both(lambda x: torch.softmax(x @ x.T, -1), torch.randn(5, 7))
    assert torch.equal(want, got.cpu())


@on_host
def test_inductor_compiles_a_flagos_graph_as_the_cpu_graph_it_stands_for():
    # On the host runtime a flagos graph, handed over for the native device,
    # is the graph CPU's own compile makes (CPU tensors' device has no index):
    # inductor's cache, filled by the CPU compile, serves the flagos one.
    from torch._dynamo.utils import counters
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache

    def fn(x):
        return torch.nn.functional.gelu(x @ x.T).sum(-1)

    x = torch.randn(6, 5)
    torch._dynamo.reset()
    with fresh_cache(), config.patch(fx_graph_cache=True):
        counters.clear()
        want = torch.compile(fn)(x)
        assert counters["inductor"]["fxgraph_cache_miss"] == 1
        torch._dynamo.reset()
        got = torch.compile(fn)(x.to("flagos"))
        assert counters["inductor"]["fxgraph_cache_hit"] == 1
        assert counters["inductor"]["fxgraph_cache_miss"] == 1
    assert got.device.type == "flagos" and torch.equal(got.cpu(), want)


def test_inductor_joint_graph_passes_see_the_native_device():
    # Inductor's joint-graph passes run before the forward and backward are
    # split, and some choose by device type (on a GPU a batch-1 bmm becomes
    # an mm: other rounding). On a flagos graph they see the native device's
    # values, as on the native graph; flagos's own come back after them.
    from torch._inductor import config

    seen = []

    def record(graph):  # a custom joint pass: the devices of the graph's values
        seen.extend(n.meta["val"].device.type for n in graph.nodes if isinstance(n.meta.get("val"), torch.Tensor))

    torch._dynamo.reset()
    model = make("flagos")
    x = torch.randn(8, 16).to("flagos")
    with config.patch(joint_custom_pre_pass=record):
        loss = torch.compile(model)(x).pow(2).mean()
        loss.backward()
    assert seen and set(seen) == {flagos_core._C._native_device_type()}
    eager = make("flagos")
    eager(x).pow(2).mean().backward()
    assert loss.device.type == "flagos"
    for p, e in zip(model.parameters(), eager.parameters()):
        assert p.grad.device.type == "flagos"
        torch.testing.assert_close(p.grad.cpu(), e.grad.cpu())


@on_host
def test_inductor_trains_a_conv_net_it_lays_out_channels_last():
    # Inductor gives a convolution-heavy graph's inputs channels_last
    # strides; the graph's views were traced with flagos's strides. Tracing
    # the fakes afresh on the native device broke a view (CPU's meta kernels
    # keep channels_last); the fakes are carried over as traced instead.
    from transformers import ResNetConfig, ResNetForImageClassification

    torch._dynamo.reset()
    torch.manual_seed(0)
    native = ResNetForImageClassification(ResNetConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                                                       embedding_size=8))
    flagos = copy.deepcopy(native).to("flagos")
    pixels, labels = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    want = torch.compile(native)(pixel_values=pixels, labels=labels)
    got = torch.compile(flagos)(pixel_values=pixels.to("flagos"), labels=labels.to("flagos"))
    want.loss.backward()
    got.loss.backward()
    assert torch.equal(got.logits.cpu(), want.logits)
    for n, f in zip(native.parameters(), flagos.parameters()):
        assert torch.equal(f.grad.cpu(), n.grad)


def test_ops_routed_elsewhere_stay_calls_through_flagos():
    # An op flagos routes to a provider other than the runtime's own stays a
    # call through flagos in the compiled code. Integer histc on the host
    # runtime: CPU has no kernel for it, the composite provider counts as
    # CUDA's kernel does. A user's route is kept too.
    torch._dynamo.reset()
    x = torch.randint(0, 10, (64,), dtype=torch.int32).to("flagos")

    def count(t):
        return torch.histc(t + 1, bins=5, min=1, max=10) * 2

    want = count(x)
    with flagos_core.trace() as t:
        got = torch.compile(count)(x)
    assert torch.equal(got.cpu(), want.cpu())
    assert {p for (op, p) in t.counts if op.startswith("histc")} == {flagos_core.route("aten::histc")}

    # A factory flagos's core serves (empty) has no flagos tensor to pass
    # through: it stays the native device's (transformers' mixture-of-experts
    # layers invert a permutation this way).
    torch._dynamo.reset()

    def invert(perm):
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel(), device=perm.device)
        return inverse

    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.compile(invert)(perm.to("flagos")).cpu(), invert(perm))

    torch._dynamo.reset()
    flagos_core.set_route("aten::mm", "cpu_fallback")
    try:
        a, b = torch.randn(4, 8), torch.randn(8, 3)
        with flagos_core.trace() as t:
            got = torch.compile(lambda p, q: (p @ q).relu())(a.to("flagos"), b.to("flagos"))
        assert torch.equal(got.cpu(), (a @ b).relu())
        assert t.fallbacks == ["mm"]
    finally:
        flagos_core.clear_route("aten::mm")


def test_inductor_code_generation_for_flagos_itself_says_what_works():
    # Inductor generates no code for flagos itself; asked for it (by a road
    # other than torch.compile) it says so and what works, not a KeyError.
    with pytest.raises(RuntimeError, match="compiles flagos graphs for the native device.*aot_eager"):
        torch.flagos.Scheduling(None)
    # Asking torch.flagos for anything else is still an ordinary AttributeError.
    assert not hasattr(torch.flagos, "no_such_name")


def test_the_native_devices_keep_their_own_inductor_device_tables():
    # flagos gives inductor a device-op table of its own. Made in a fresh
    # process before inductor's first lookup (when torch.compile first looks
    # for flagos's code generators), it must leave CPU's and CUDA's tables
    # theirs: torch before 2.13 filled them only while none was registered,
    # and CUDA's generated code then failed to import (a syntax error).
    import subprocess
    import sys

    code = (
        "import torch, flagos_core\n"
        "from torch._inductor.codegen.common import init_backend_registration, get_device_op_overrides\n"
        "init_backend_registration()\n"
        "print(*(type(get_device_op_overrides(d)).__name__ for d in ('cpu', 'cuda', 'flagos')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["CpuDeviceOpOverrides", "CUDADeviceOpOverrides", "CpuDeviceOpOverrides"]


CACHED_COMPILES = r"""
import json, sys
import torch, flagos_core
from torch._dynamo.utils import counters

torch._functorch.config.bundled_autograd_cache = sys.argv[2] == "bundled"

def make(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)

model = make("flagos")
x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
loss = torch.compile(model)(x.to("flagos")).pow(2).mean()
loss.backward()
counts = torch.compile(lambda t: torch.histc(t + 1, bins=5, min=1, max=10) * 2)(
    torch.arange(64, dtype=torch.int32).remainder(10).to("flagos"))
moved = torch.compile(lambda t: (t * 2).to("flagos") + 1)(torch.arange(4.0))  # no flagos input: flagos named inside
if sys.argv[3] == "rerouted":  # a route set since the cache was filled
    flagos_core.set_route("aten::mm", "cpu_fallback")
with flagos_core.trace() as t:
    product = torch.compile(lambda a: a @ a.T)(x.to("flagos"))
with torch.no_grad():  # the native device's own compile of the same model (inference: saved once compiled)
    native = torch.compile(make(sys.argv[1]))(x.to(sys.argv[1]))
print(json.dumps(dict(
    cache={k: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")},
    devices=[loss.device.type, counts.device.type, moved.device.type, product.device.type]
    + [p.grad.device.type for p in model.parameters()],
    native_device=native.device.type, fallbacks=t.fallbacks, loss=loss.item(),
    grads=[p.grad.cpu().tolist() for p in model.parameters()], counts=counts.cpu().tolist(),
    moved=moved.cpu().tolist(), product=product.cpu().tolist())))
"""


@pytest.mark.native
@pytest.mark.parametrize("entries", [
    "unbundled",
    # Bundled entries keep no flagos graph on any device, so what this case
    # checks does not depend on the device; on a GPU its three processes
    # compile every graph afresh, minutes of the GPU check's ten (BW).
    pytest.param("bundled", marks=pytest.mark.skipif(
        flagos_core.runtime()["name"] != "host", reason="device-independent; minutes on a GPU (checked on the host)")),
])
def test_a_warm_start_takes_flagos_graphs_from_aot_autograds_cache(tmp_path, native_device, entries):
    # AOT autograd's cache serves flagos graphs as it serves the native
    # device's: a second process skips tracing them. Its entries name the
    # native graphs' compiled code, so a hit must put the crossing back
    # (flagos tensors in and out, ops routed elsewhere called through flagos,
    # defined afresh in the new process); the native device's own compile of
    # the same model, sharing the cache, must stay native. Where flagos
    # cannot keep the crossing in an entry (bundled entries hold the compiled
    # code itself; a torch whose cache flagos does not know), flagos graphs
    # are neither saved nor served, and the warm process traces them again.
    import json
    import os
    import subprocess
    import sys

    from flagos_core._inductor_cache import aot_cache_keeps_the_crossing

    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))

    def run(routes="as they were"):
        out = subprocess.run([sys.executable, "-c", CACHED_COMPILES, native_device.type, entries, routes],
                             capture_output=True, text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold, warm, rerouted = run(), run(), run("rerouted")
    # training, histc, the graph without a flagos input, the product, the native model
    graphs = 5 if entries == "unbundled" and aot_cache_keeps_the_crossing() else 1  # else the native model's only
    counters = {"cold": cold["cache"], "warm": warm["cache"], "rerouted": rerouted["cache"]}  # for a failure's message
    assert cold["cache"].get("autograd_cache_hit", 0) == 0, counters
    assert cold["cache"].get("autograd_cache_saved", 0) == graphs, counters
    assert warm["cache"].get("autograd_cache_hit", 0) == graphs and warm["cache"].get("autograd_cache_miss", 0) == 0, \
        counters
    for found in (cold, warm, rerouted):
        assert set(found["devices"]) == {"flagos"} and found["native_device"] == native_device.type
    for name, found in (("warm", warm), ("rerouted", rerouted)):
        # The rerouted product is the CPU's (cpu_fallback), below.
        for key in ("loss", "grads", "counts", "moved") + (("product",) if found is warm else ()):
            assert found[key] == cold[key], (name, key)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    assert rerouted["product"] == (x @ x.T).tolist()
    if native_device.type == "cpu":
        assert cold["product"] == rerouted["product"]
    # With mm routed elsewhere since, its graph is compiled anew (calling mm
    # through flagos, to the route's provider), the others are served.
    assert cold["fallbacks"] == warm["fallbacks"] == [] and rerouted["fallbacks"] == ["mm"]
    if graphs > 1:
        assert rerouted["cache"].get("autograd_cache_hit", 0) == graphs - 1, counters
        assert rerouted["cache"].get("autograd_cache_miss", 0) == 1, counters
    x = torch.arange(64, dtype=torch.int32).remainder(10)
    assert cold["counts"] == (torch.histc(x.float() + 1, bins=5, min=1, max=10) * 2).tolist()
    assert cold["moved"] == (torch.arange(4.0) * 2 + 1).tolist()


@on_host
@pytest.mark.parametrize("road", ["dynamo_optimize", "compile_fx_backend"])
def test_inductor_reached_by_another_road_first_compiles_flagos_graphs(road):
    # The hand-over hooked torch.compile's own inductor wrapper only: a
    # process whose first inductor compile came another way stopped with
    # "inductor was asked to generate code for the flagos device itself".
    import subprocess
    import sys
    import textwrap

    backend = {"dynamo_optimize": "torch._dynamo.optimize('inductor')(f)",
               "compile_fx_backend": "torch.compile(f, backend=__import__('torch._inductor.compile_fx', "
                                     "fromlist=['compile_fx']).compile_fx)"}[road]
    code = textwrap.dedent(f"""
        import torch
        torch.manual_seed(0)
        x = torch.randn(4, 4)
        f = lambda x: (x.sin() @ x).relu()
        got = {backend}(x.to("flagos"))
        want = torch.compile(f)(x)
        assert got.device.type == "flagos" and torch.equal(got.cpu(), want), (got, want)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@on_host
def test_a_routed_op_given_a_python_number_in_a_tensor_slot_compiles():
    # `x * 3` traces as mul.Tensor(x, 3); the op that calls through flagos
    # for a routed overload had the Tensor schema, and compiling raised
    # "Expected a value of type 'Tensor' for argument 'other'".
    def f(x):
        return (x.mul(3) + 2.5) * x

    x = torch.arange(6.0)
    want = torch.compile(f)(x)
    with flagos_core.routes({"mul.Tensor": "cpu_fallback", "add.Tensor": "cpu_fallback"}):
        with flagos_core.trace() as t:
            got = torch.compile(f)(x.to("flagos"))
    assert torch.equal(got.cpu(), want)
    assert t.counts[("mul.Tensor", "cpu_fallback")] == 2 and t.counts[("add.Tensor", "cpu_fallback")] == 1


def test_a_users_own_flagos_kernel_runs_in_compiled_code():
    # A custom op's kernel registered for flagos, and a user's flagos kernel
    # for an ATen op, ran in eager code; inductor's code called the native
    # device's kernel instead (the custom op's CPU kernel, CPU's sinh).
    torch._dynamo.reset()

    @torch.library.custom_op("flagos_test::tagged", mutates_args=())
    def tagged(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @tagged.register_kernel("flagos")
    def _(x):
        return x + 100

    @tagged.register_fake
    def _(x):
        return torch.empty_like(x)

    x = torch.zeros(3, device="flagos")
    assert torch.equal(torch.compile(tagged)(x).cpu(), torch.full((3,), 100.0))
    library = torch.library.Library("aten", "IMPL")
    try:
        library.impl("sinh", lambda t: torch.full_like(t.cpu(), 7.0).to(t.device), "PrivateUse1")
        torch._dynamo.reset()
        assert torch.equal(torch.compile(torch.sinh)(x).cpu(), torch.full((3,), 7.0))
    finally:
        library._destroy()
    torch._dynamo.reset()
    assert torch.equal(torch.compile(torch.sinh)(x).cpu(), torch.sinh(torch.zeros(3)))
