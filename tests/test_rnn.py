"""Recurrent layers on flagos: for PrivateUse1 tensors PyTorch's LSTM and GRU
cells call the fused cell kernels, which only CUDA has; elsewhere (the host
runtime) the core's `composite` provider serves them. The results equal the
native device's up to the order of operations: the native device runs its own
path (cuDNN on CUDA, an unfused cell or oneDNN on the CPU)."""

import pytest
import torch

import flagos_core
from native_reference import native_device, results_on_native

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
    results = []
    for layer, kwargs in cases:
        torch.manual_seed(0)
        module = getattr(torch.nn, layer)(12, 16, **kwargs).to(device)
        x = torch.randn(5, 3, 12) if not layer.endswith("Cell") else torch.randn(3, 12)
        out = module(x.to(device))
        out = out[0] if isinstance(out, tuple) else out
        out.square().sum().backward()
        results += [out.detach(), *(p.grad for p in module.parameters())]
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
    assert len(flagos) == len(native)
    for got, want in zip(flagos, native):
        assert got.device.type == "flagos"
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host runtime's routes")
def test_fused_cells_go_to_the_composite_provider_where_the_runtime_has_none():
    for op in ("_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl",
               "_thnn_fused_gru_cell", "_thnn_fused_gru_cell_backward"):
        assert flagos_core.route(op) == "composite"
        assert flagos_core.route_layer(op) == "default (host has no kernel)"
    with flagos_core.trace() as t:
        torch.nn.LSTM(4, 4).to("flagos")(torch.randn(2, 1, 4, device="flagos"))
    assert t.counts[("_thnn_fused_lstm_cell", "composite")] == 2
