"""Layers whose PyTorch code calls kernels only CUDA has, for PrivateUse1
tensors as for CUDA ones: LSTM and GRU (the fused cells) and rms_norm's
backward. Elsewhere (the host runtime) the core's `composite` provider serves
them. The results equal the native device's up to the order of operations:
the native device may run another path (cuDNN's RNN on CUDA; an unfused cell
or oneDNN, and rms_norm's decomposed backward, on the CPU)."""

import pytest
import torch

import flagos_core
from native_reference import assert_matches_native, native_device, results_on_native

pytestmark = pytest.mark.native

CASES = {
    "lstm": ("LSTM", {}),
    "lstm without bias": ("LSTM", {"bias": False}),
    "lstm, 2 layers, bidirectional": ("LSTM", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    "lstm with projections": ("LSTM", {"proj_size": 8}),
    "gru": ("GRU", {}),
    "gru without bias": ("GRU", {"bias": False}),
    "lstm cell": ("LSTMCell", {}),
    "gru cell": ("GRUCell", {}),
}


def _run_layers(device, cases):
    # Self-contained: on an accelerator it runs in a side process (one for
    # every case). Per case: the output, then each parameter's gradient.
    tf32, torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.allow_tf32, False  # cuDNN's RNN in float32
    results = []
    try:
        for layer, kwargs in cases:
            torch.manual_seed(0)
            module = getattr(torch.nn, layer)(12, 16, **kwargs).to(device)
            x = torch.randn(5, 3, 12) if not layer.endswith("Cell") else torch.randn(3, 12)
            out = module(x.to(device))
            out = out[0] if isinstance(out, tuple) else out
            out.square().sum().backward()
            results += [out.detach(), *(p.grad for p in module.parameters())]
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    return results


@pytest.fixture(scope="module")
def native_results(tmp_path_factory):
    made = results_on_native(_run_layers, native_device(), tmp_path_factory.mktemp("rnn"), cases=list(CASES.values()))
    per_case, start = {}, 0
    for case, (layer, kwargs) in CASES.items():
        count = 1 + len(list(getattr(torch.nn, layer)(12, 16, **kwargs).parameters()))
        per_case[case] = made[start:start + count]
        start += count
    assert start == len(made)
    return per_case


@pytest.mark.parametrize("case", CASES)
def test_recurrent_layers_match_the_native_device(case, native_results):
    native = native_results[case]
    with flagos_core.trace() as t:
        flagos = _run_layers(torch.device("flagos"), [CASES[case]])
    assert t.fallbacks == []
    assert_matches_native(flagos, native, rtol=1e-4, atol=1e-5)


def _rms_norms(device):
    # Self-contained: on an accelerator it runs in a side process. Per case:
    # the output, the input's gradient, and the weight's where there is one.
    results = []
    for shape, normalized, with_weight in (((4, 8), (8,), True), ((2, 3, 8), (3, 8), True), ((4, 8), (8,), False)):
        torch.manual_seed(0)
        x = torch.randn(*shape).to(device).requires_grad_()
        w = torch.randn(*normalized).to(device).requires_grad_() if with_weight else None
        y = torch.nn.functional.rms_norm(x, normalized, w, 1e-6)
        (y * torch.linspace(-1, 1, y.numel(), device=device).view_as(y)).sum().backward()
        results += [y.detach(), x.grad] + ([w.grad] if with_weight else [])
    return results


def test_rms_norm_and_its_backward_match_the_native_device(native_device, tmp_path):
    native = results_on_native(_rms_norms, native_device, tmp_path)
    with flagos_core.trace() as t:
        flagos = _rms_norms(torch.device("flagos"))
    assert t.fallbacks == []
    assert_matches_native(flagos, native, rtol=1e-4, atol=1e-5)
    for i in (0, 3, 6):  # the outputs: the same kernel on both sides
        assert torch.equal(flagos[i].cpu(), native[i])


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host runtime's routes")
def test_kernels_only_cuda_has_go_to_the_composite_provider_where_the_runtime_has_none():
    for op in ("_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl",
               "_thnn_fused_gru_cell", "_thnn_fused_gru_cell_backward", "_fused_rms_norm_backward"):
        assert flagos_core.route(op) == "composite"
        assert flagos_core.route_layer(op) == "default (host has no kernel)"
    with flagos_core.trace() as t:
        torch.nn.LSTM(4, 4).to("flagos")(torch.randn(2, 1, 4, device="flagos"))
    assert t.counts[("_thnn_fused_lstm_cell", "composite")] == 2
