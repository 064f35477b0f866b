"""Composite ops run whole on the native device where no autograd is needed
(flagos_core/codegen/whole_ops.txt, core/WholeKernel.h): one call routed to
the runtime's provider instead of one per op of the decomposition, with the
native device's results. With autograd, or with tensors that are not plain
flagos tensors, they decompose on flagos as before.
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

import flagos_core
from native_reference import compare_with_native, native_device

PROVIDER = flagos_core.runtime()["name"]
NATIVE = native_device()


def make_inputs(device, requires_grad=False):
    g = torch.Generator().manual_seed(0)

    def make(*shape):
        return torch.randn(*shape, generator=g).to(device).requires_grad_(requires_grad)

    return {
        "x": make(2, 5, 64),
        "w": make(48, 64),
        "b": make(48),
        "q": make(2, 8, 5, 32),
        "kv": make(2, 4, 7, 32),
        "norm_w": make(64),
        "norm_b": make(64),
        "channels": make(2, 64, 5),
    }


# name -> (overload the call is traced as when whole, the call)
CALLS = {
    "linear": ("linear", lambda t: F.linear(t["x"], t["w"], t["b"])),
    "matmul": ("matmul", lambda t: torch.matmul(t["x"], t["norm_w"])),
    "sdpa": (
        "scaled_dot_product_attention",
        lambda t: F.scaled_dot_product_attention(t["q"], t["kv"], t["kv"], enable_gqa=True),
    ),
    "rms_norm": ("rms_norm", lambda t: F.rms_norm(t["x"], (64,), t["norm_w"], 1e-6)),
    "layer_norm": ("layer_norm", lambda t: F.layer_norm(t["x"], (64,), t["norm_w"], t["norm_b"])),
    "group_norm": ("group_norm", lambda t: F.group_norm(t["channels"], 4)),
}
WHOLE = {overload for overload, _ in CALLS.values()}


def traced_ops(fn, *args):
    with flagos_core.trace() as t:
        out = fn(*args)
    assert t.fallbacks == []
    return out, t.counts


# Self-contained (on an accelerator the native side runs this source in a
# side process without flagos): every call of CALLS, without autograd.
def all_calls_without_grad(device):
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)

    def make(*shape):
        return torch.randn(*shape, generator=g).to(device)

    x, w, b, q, kv, nw, nb = make(2, 5, 64), make(48, 64), make(48), make(2, 8, 5, 32), make(2, 4, 7, 32), make(64), make(64)
    w = torch.nn.Parameter(w)  # a model's weight: requires grad, under no_grad
    with torch.no_grad():
        return [
            F.linear(x, w, b),
            torch.matmul(x, w.t()),
            torch.matmul(x[0, 0], w.t()),
            F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True),
            F.scaled_dot_product_attention(q, kv[:, :, :5], kv[:, :, :5], is_causal=True, enable_gqa=True),
            F.scaled_dot_product_attention(q, kv, kv, attn_mask=kv[0, 0, :, :1].t() > 0, enable_gqa=True),
            F.rms_norm(x, (64,), nw, 1e-6),
            F.layer_norm(x, (64,), nw, nb),
            F.group_norm(x.transpose(1, 2), 4),
        ]


def all_calls_with_grad(device):
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)

    def make(*shape):
        return torch.randn(*shape, generator=g).to(device).requires_grad_()

    x, w, b, q, kv, nw, nb = make(2, 5, 64), make(48, 64), make(48), make(2, 8, 5, 32), make(2, 4, 7, 32), make(64), make(64)
    outs = [
        F.linear(x, w, b),
        torch.matmul(x, w.t()),
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True),
        F.rms_norm(x, (64,), nw, 1e-6),
        F.layer_norm(x, (64,), nw, nb),
        F.group_norm(x.transpose(1, 2), 4, nw, nb),
    ]
    sum(o.float().pow(2).sum() for o in outs).backward()
    return [o.detach() for o in outs] + [t.grad for t in (x, w, b, q, kv, nw, nb)]


@pytest.mark.parametrize("name", list(CALLS))
def test_a_call_without_autograd_is_one_call_to_the_runtime(name):
    overload, call = CALLS[name]
    t = make_inputs("flagos")
    t["w"] = torch.nn.Parameter(t["w"])
    with torch.no_grad():
        _, counts = traced_ops(call, t)
    assert set(counts) == {(overload, PROVIDER)}, f"{name} decomposed on flagos: {sorted(counts)}"


def test_results_without_autograd_are_the_native_devices(tmp_path):
    compare_with_native(all_calls_without_grad, NATIVE, tmp_path)


@pytest.mark.parametrize("name", list(CALLS))
def test_with_autograd_the_call_decomposes(name):
    overload, call = CALLS[name]
    _, counts = traced_ops(call, make_inputs("flagos", requires_grad=True))
    assert not {op for op, _ in counts} & WHOLE, f"{name} ran whole though its inputs require grad"
    assert counts, "nothing traced"


def test_results_and_gradients_with_autograd_are_the_native_devices(tmp_path):
    compare_with_native(all_calls_with_grad, NATIVE, tmp_path)


def test_grad_mode_decides_not_the_weights_flag():
    # The same Parameter (requires_grad) runs whole under no_grad and
    # decomposes under grad mode; a plain tensor runs whole in either mode.
    t = make_inputs("flagos")
    w = torch.nn.Parameter(t["w"])
    _, counts = traced_ops(F.linear, t["x"], w)
    assert ("linear", PROVIDER) not in counts
    with torch.no_grad():
        _, counts = traced_ops(F.linear, t["x"], w)
    assert set(counts) == {("linear", PROVIDER)}
    _, counts = traced_ops(F.linear, t["x"], t["w"])
    assert set(counts) == {("linear", PROVIDER)}


def _batched_with_parameters(device):
    # Self-contained. Under no_grad and inference mode, with weights that
    # require grad (a model's, in eval or generate): non-contiguous batched
    # inputs, whose matmul folds or stays batched by the weight's flag.
    torch.manual_seed(0)
    w, b, x = torch.randn(48, 64), torch.randn(48), torch.randn(2, 6, 64)
    w = w.to(device).requires_grad_()
    b = b.to(device).requires_grad_()
    x = x.to(device)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).to(device).eval()
    results = []
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            # (2, 1, 64) with strides (64, 1, 1), as Mamba's x_proj gets it:
            # contiguous, yet its leading dimensions do not view as one.
            for inp in (x[:, -1:], x.transpose(0, 1), x[:, ::2], x, x[:, 0].contiguous().view(2, 64, 1).transpose(1, 2)):
                results += [torch.nn.functional.linear(inp, w), torch.nn.functional.linear(inp, w, b),
                            torch.matmul(inp, w.t())]
            results.append(mha(x[:, -2:], x, x, need_weights=False)[0])
            # matmul with the operand that requires grad on the left, or
            # batches of 1 and more: should_fold and the batch-1 squeeze.
            for left, right in (((4, 5), (2, 5, 3)), ((5,), (2, 5, 3)), ((7, 5), (3, 2, 5, 3)),
                                ((1, 4, 5), (2, 5, 3)), ((2, 4, 5), (1, 5, 3))):
                p = torch.randn(left).to(device).requires_grad_()
                q = torch.randn(right).to(device)
                results += [torch.matmul(p, q), torch.matmul(q.mT, p.mT if p.dim() > 1 else p),
                            torch.matmul(p.detach(), q.requires_grad_())]
    return results


def test_parameters_outside_grad_mode_choose_as_natively(tmp_path):
    # Native aliases carry no requires_grad; matmul reads it (fold or stay
    # batched), so such calls decompose on flagos, and contiguous ones, where
    # the choice cannot differ, still run whole.
    compare_with_native(_batched_with_parameters, NATIVE, tmp_path)
    t = make_inputs("flagos")
    w = torch.nn.Parameter(t["w"])
    with torch.no_grad():
        _, whole = traced_ops(F.linear, t["x"], w)
        _, decomposed = traced_ops(F.linear, t["x"].transpose(0, 1), w)
    assert set(whole) == {("linear", PROVIDER)}
    assert ("linear", PROVIDER) not in decomposed


def test_forward_mode_gradients_decompose_and_equal_the_native_devices():
    def jvp(device):
        t = make_inputs(device)
        tangent = torch.ones_like(t["x"])
        with forward_ad.dual_level():
            dual = forward_ad.make_dual(t["x"], tangent)
            out = F.layer_norm(F.linear(dual, t["w"], t["b"]), (48,))
            primal, out_tangent = forward_ad.unpack_dual(out)
        return primal, out_tangent

    with torch.no_grad():
        (primal, tangent), counts = traced_ops(jvp, "flagos")
        native_primal, native_tangent = jvp(NATIVE)
    assert not {op for op, _ in counts} & WHOLE
    assert tangent is not None
    if NATIVE.type == "cpu":
        assert torch.equal(primal.cpu(), native_primal) and torch.equal(tangent.cpu(), native_tangent)
    else:  # an accelerator's forward AD in this process: compared within rounding
        torch.testing.assert_close(primal.cpu(), native_primal.cpu())
        torch.testing.assert_close(tangent.cpu(), native_tangent.cpu())


@pytest.mark.parametrize("name", list(CALLS))
def test_inference_mode_runs_whole_with_the_same_results(name):
    # Inference mode skips the autograd keys and reaches the kernels'
    # PrivateUse1 registration, with inference tensors too.
    overload, call = CALLS[name]
    t = make_inputs("flagos")
    with torch.no_grad():
        whole = call(t)
    with torch.inference_mode():
        inference = make_inputs("flagos")
        out, counts = traced_ops(call, t)
        out_of_inference_tensors, _ = traced_ops(call, inference)
    assert set(counts) == {(overload, PROVIDER)}
    assert torch.equal(out.cpu(), whole.cpu())
    assert torch.equal(out_of_inference_tensors.cpu(), whole.cpu())


def test_conjugate_views_decompose():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.complex64, generator=g)
    w = torch.randn(4, 8, dtype=torch.complex64, generator=g)
    with torch.no_grad():
        out, counts = traced_ops(F.linear, x.to("flagos").conj(), w.to("flagos"))
    assert ("linear", PROVIDER) not in counts
    if NATIVE.type == "cpu":
        assert torch.equal(out.cpu(), F.linear(x.conj(), w))
    else:
        torch.testing.assert_close(out.cpu(), F.linear(x.conj(), w))


def test_a_python_dispatch_mode_sees_the_decomposition_on_flagos_tensors():
    # make_fx and logging modes saw the native kernel's inner calls, on
    # native aliases (make_fx baked them into the graph as constants).
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import TorchDispatchMode

    class Devices(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen += [(func, a.device.type) for a in args if isinstance(a, torch.Tensor)]
            return func(*args, **(kwargs or {}))

    t = make_inputs("flagos")
    with torch.no_grad(), Devices() as mode:
        F.linear(t["x"], t["w"])
    assert mode.seen and {device for _, device in mode.seen} == {"flagos"}
    graph = make_fx(lambda x, w: F.linear(x, w))(t["x"], t["w"])
    other = torch.randn_like(t["x"])
    torch.testing.assert_close(graph(other, t["w"]).cpu(), F.linear(other.cpu(), t["w"].cpu()))


def test_sdpa_with_dropout_decomposes():
    # Its dropout draws inside the native kernel, from the native device's
    # generator rather than flagos's: such calls keep the decomposition.
    t = make_inputs("flagos")
    with torch.no_grad():
        out, counts = traced_ops(F.scaled_dot_product_attention, t["q"], t["q"], t["q"], None, 0.5)
    assert ("scaled_dot_product_attention", PROVIDER) not in counts
    assert out.shape == t["q"].shape


def test_other_devices_get_the_decompositions_error():
    t = make_inputs("flagos")
    with torch.no_grad(), pytest.raises(RuntimeError, match="device"):
        F.linear(t["x"], t["w"].cpu())


def test_a_route_elsewhere_turns_whole_calls_off_until_cleared():
    # histc has a native kernel: a decomposition could reach it, so a route
    # of it to another provider must not be bypassed by a whole call.
    t = make_inputs("flagos")
    flagos_core.set_route("histc", "composite")
    try:
        with torch.no_grad():
            out, counts = traced_ops(F.linear, t["x"], t["w"], t["b"])
        assert ("linear", PROVIDER) not in counts
    finally:
        flagos_core.clear_route("histc")
    with torch.no_grad():
        whole, counts = traced_ops(F.linear, t["x"], t["w"], t["b"])
    assert set(counts) == {("linear", PROVIDER)}
    assert torch.equal(out.cpu(), whole.cpu())


@pytest.mark.skipif(PROVIDER != "host", reason="needs an overload the native device (CPU) has no kernel for")
def test_a_route_the_native_device_cannot_reach_keeps_whole_calls():
    t = make_inputs("flagos")
    flagos_core.set_route("_thnn_fused_lstm_cell", "composite")  # CUDA-only
    try:
        with torch.no_grad():
            _, counts = traced_ops(F.linear, t["x"], t["w"], t["b"])
        assert set(counts) == {("linear", PROVIDER)}
    finally:
        flagos_core.clear_route("_thnn_fused_lstm_cell")


def test_compiled_graphs_trace_the_decomposition():
    # FakeTensors are not plain flagos tensors: compiling decomposes, and
    # the compiled function gives eager's results.
    t = make_inputs("flagos")
    fn = torch.compile(lambda x, w, b: F.linear(x, w, b).relu(), backend="aot_eager")
    with torch.no_grad():
        eager = F.linear(t["x"], t["w"], t["b"]).relu()
        compiled = fn(t["x"], t["w"], t["b"])
    torch.testing.assert_close(compiled.cpu(), eager.cpu())


def test_the_switch_turns_whole_calls_off_and_on():
    t = make_inputs("flagos")
    assert flagos_core.whole_ops()
    flagos_core.set_whole_ops(False)
    try:
        assert not flagos_core.whole_ops()
        with torch.no_grad():
            decomposed, counts = traced_ops(F.linear, t["x"], t["w"], t["b"])
        assert ("linear", PROVIDER) not in counts
    finally:
        flagos_core.set_whole_ops(True)
    with torch.no_grad():
        whole, counts = traced_ops(F.linear, t["x"], t["w"], t["b"])
    assert set(counts) == {("linear", PROVIDER)}
    assert torch.equal(decomposed.cpu(), whole.cpu())


@pytest.mark.parametrize("value, expected", [("0", "False"), ("off", "False"), ("1", "True"), ("", "True")])
def test_the_environment_variable_sets_the_switch(value, expected):
    env = dict(os.environ, FLAGOS_WHOLE_OPS=value)
    out = subprocess.run([sys.executable, "-c", "import flagos_core; print(flagos_core.whole_ops())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == expected


def test_a_bad_environment_value_is_named():
    env = dict(os.environ, FLAGOS_WHOLE_OPS="maybe")
    out = subprocess.run([sys.executable, "-c", "import flagos_core"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "FLAGOS_WHOLE_OPS: expected 1 or 0, got 'maybe'" in out.stderr
