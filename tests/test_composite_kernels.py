"""Layers whose PyTorch code calls kernels only CUDA has, for PrivateUse1
tensors as for CUDA ones: LSTM and GRU (the fused cells) and rms_norm's
backward; and `histc` on integers, which model code written for CUDA calls.
Elsewhere (the host runtime) the core's `composite` provider serves them
(SyncBatchNorm's kernels are tested in test_distributed.py). The recurrent
layers and rms_norm take the native device's own path (cuDNN's RNN and the
fused rms_norm on CUDA, CPU's decompositions on the host runtime) and equal
its results bitwise, and so do nn.LSTMCell and nn.GRUCell (CPU's unfused
cells on the host runtime), and packed sequences (cuDNN's RNN; CPU's
packed layers)."""

import copy
import warnings

import pytest
import torch

import flagos_core
from native_reference import assert_matches_native, compare_with_native, native_device, results_on_native

pytestmark = pytest.mark.native

CASES = {
    "lstm": ("LSTM", {}),
    "lstm without bias": ("LSTM", {"bias": False}),
    "lstm, 2 layers, bidirectional": ("LSTM", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    "lstm with projections": ("LSTM", {"proj_size": 8}),
    "gru": ("GRU", {}),
    "gru without bias": ("GRU", {"bias": False}),
    "gru, 2 layers, bidirectional": ("GRU", {"num_layers": 2, "bidirectional": True}),
    "rnn tanh": ("RNN", {}),
    "rnn relu": ("RNN", {"nonlinearity": "relu", "num_layers": 2}),
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
            # A step in place, then the updated weights read again.
            torch.optim.SGD(module.parameters(), lr=0.1).step()
            with torch.no_grad():
                out = module(x.to(device))
            results.append((out[0] if isinstance(out, tuple) else out).detach())
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    return results


@pytest.fixture(scope="module")
def native_results(tmp_path_factory):
    made = results_on_native(_run_layers, native_device(), tmp_path_factory.mktemp("rnn"), cases=list(CASES.values()))
    per_case, start = {}, 0
    for case, (layer, kwargs) in CASES.items():
        count = 2 + len(list(getattr(torch.nn, layer)(12, 16, **kwargs).parameters()))
        per_case[case] = made[start:start + count]
        start += count
    assert start == len(made)
    return per_case


def _cells_on_the_host(layer):
    return layer.endswith("Cell") and native_device().type == "cpu"


@pytest.mark.parametrize("case", CASES)
def test_recurrent_layers_match_the_native_device(case, native_results):
    native = native_results[case]
    layer = CASES[case][0]
    with flagos_core.trace() as t:
        flagos = _run_layers(torch.device("flagos"), [CASES[case]])
    assert t.fallbacks == []
    if _cells_on_the_host(layer):
        assert_matches_native(flagos, native, rtol=1e-3, atol=1e-4)
    else:
        assert_matches_native(flagos, native)
    if native_device().type == "cuda" and not layer.endswith("Cell"):
        # cuDNN's RNN, as native CUDA runs it: one call per forward (two
        # here, before and after the SGD step), not one per step.
        assert t.counts[("_cudnn_rnn", "cuda")] == 2
        assert not any(op.startswith("_thnn_fused") for (op, _) in t.counts)


def test_recurrent_layers_pack_their_weights_where_the_native_device_does():
    # flatten_parameters() packs a layer's weights into one buffer for cuDNN
    # (on CUDA; the CPU packs nothing): flagos's too, with the CUDA plugin.
    torch.manual_seed(0)
    layer = torch.nn.LSTM(12, 16, num_layers=2).to("flagos")
    storages = {p.untyped_storage()._cdata for p in layer.parameters()}
    assert len(storages) == (1 if native_device().type == "cuda" else len(list(layer.parameters())))
    x = torch.randn(5, 3, 12, device="flagos")
    with flagos_core.trace() as t:
        packed = layer(x)[0]
    with torch.no_grad():
        for p in layer.parameters():
            p.data = p.data.clone()  # out of the buffer: cuDNN packs them on each call
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch's advice to call flatten_parameters() is not passed on
        unpacked = layer(x)[0]
    assert torch.equal(packed.cpu(), unpacked.cpu())
    assert t.fallbacks == []


@pytest.mark.parametrize("layer", ["LSTM", "GRU", "RNN"])
def test_recurrent_layers_in_inference_mode_take_the_same_path(layer):
    # inference_mode skips the autograd keys: the PrivateUse1 registration
    # serves it, with the results of a forward under no_grad.
    torch.manual_seed(0)
    module = getattr(torch.nn, layer)(12, 16, num_layers=2, dropout=0.5).to("flagos").eval()
    x = torch.randn(5, 3, 12, device="flagos")
    with torch.no_grad():
        want = module(x)[0]
    with torch.inference_mode(), flagos_core.trace() as t:
        got = module(x)[0]
    assert torch.equal(got.cpu(), want.cpu())
    if native_device().type == "cuda":  # dropout off in eval: cuDNN's RNN serves it
        assert t.counts[("_cudnn_rnn", "cuda")] == 1


def _run_packed(device):
    # Self-contained (a side process on an accelerator): 2-layer LSTM and GRU
    # over a packed batch of three lengths; the padded output, then each
    # parameter's gradient.
    tf32, torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.allow_tf32, False
    results = []
    try:
        for layer in ("LSTM", "GRU"):
            torch.manual_seed(0)
            module = getattr(torch.nn, layer)(12, 16, num_layers=2).to(device)
            x = torch.randn(6, 3, 12).to(device)
            packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([6, 4, 2]))
            out, _ = torch.nn.utils.rnn.pad_packed_sequence(module(packed)[0])
            out.square().sum().backward()
            results += [out.detach(), *(p.grad for p in module.parameters())]
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    return results


def test_packed_sequences_match_the_native_device(native_device, tmp_path):
    # Bitwise: cuDNN's RNN on CUDA, CPU's packed layers on the host runtime.
    with flagos_core.trace() as t:
        compare_with_native(_run_packed, native_device, tmp_path)
    assert not any("fused" in name for name, _ in t.counts)
    if native_device.type != "cpu":
        assert t.counts[("_cudnn_rnn", "cuda")] == 2


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
    # Bitwise: on CUDA the fused kernels and their backward on both sides; on
    # the host runtime the CPU's decomposition (flagos_core/_host_norms.py).
    compare_with_native(_rms_norms, native_device, tmp_path)


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host runtime's routes")
def test_kernels_only_cuda_has_go_to_the_composite_provider_where_the_runtime_has_none():
    for op in ("_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl",
               "_thnn_fused_gru_cell", "_thnn_fused_gru_cell_backward", "_fused_rms_norm_backward",
               "batch_norm_stats", "batch_norm_gather_stats", "batch_norm_gather_stats_with_counts",
               "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt", "histc"):
        assert flagos_core.route(op) == "composite"
        assert flagos_core.route_layer(op) == "default (host has no kernel)"
    # The cells serve code that calls them. nn.LSTM, nn.GRU, nn.RNN, their
    # cells and packed sequences take CPU's decompositions on the host
    # runtime (test_host_rnn.py).
    lstm = torch.nn.LSTM(4, 4).to("flagos")
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(3, 2, 4, device="flagos"), torch.tensor([3, 2]))
    gates = torch.randn(2, 16, device="flagos")
    with flagos_core.trace() as t:
        lstm(packed)
        torch.nn.LSTMCell(4, 4).to("flagos")(torch.randn(2, 4, device="flagos"))
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates, torch.randn(2, 4, device="flagos"))
    assert t.counts[("_thnn_fused_lstm_cell", "composite")] == 1  # the direct call's alone


def _histcs(device):
    # Self-contained: on an accelerator it runs in a side process. CPU's
    # histc has no integer kernel: there the reference counts the same values
    # as float64, whose bins equal the integer ones for these values.
    torch.manual_seed(0)
    cases = (  # (values, bins, min, max)
        (torch.randint(0, 8, (64,)), 8, 0, 7),  # experts per token, as transformers' MoE layers count them
        (torch.arange(-5, 20), 6, 0, 11),  # values outside the bounds left out, the top edge in the last bin
        (torch.arange(-5, 20), 7, -3, 14),  # bins of no whole width
        (torch.randint(-50, 50, (200,)), 7, 0, 0),  # the data's extremes
        (torch.full((5,), 3), 4, 0, 0),  # equal extremes, widened by one each way
        (torch.zeros(0, dtype=torch.long), 3, 0, 0),  # nothing to count
    )
    results = []
    for dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
        for values, bins, low, high in cases:
            values = values.clamp(0) if dtype == torch.uint8 else values
            if device.type == "cpu":
                results.append(torch.histc(values.double(), bins, low, high).to(dtype))
            else:
                results.append(torch.histc(values.to(dtype).to(device), bins, low, high))
    return results


def test_integer_histc_counts_as_the_native_device(native_device, tmp_path):
    flagos, native = compare_with_native(_histcs, native_device, tmp_path)
    for got, want in zip(flagos, native):
        assert got.dtype == want.dtype


def test_histc_keeps_cuda_integer_semantics_for_bounds_and_bad_input():
    values = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32, device="flagos")
    # Bounds in the input's integer type, as CUDA converts them: [0.5, 3.9] counts over [0, 3].
    assert torch.histc(values, 3, 0.5, 3.9).tolist() == [1, 1, 2]
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(values, 0, 0, 4)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(values, 2, 4, 1)


def _float_histcs(device):
    # Self-contained: on an accelerator it runs in a side process.
    torch.manual_seed(0)
    cases = ((torch.randn(1000), 10, -2, 2), (torch.rand(100, dtype=torch.float64), 5, 0, 0))
    return [torch.histc(values.to(device), bins, low, high) for values, bins, low, high in cases]


def test_float_histc_equals_the_native_device_bitwise(native_device, tmp_path):
    compare_with_native(_float_histcs, native_device, tmp_path)


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="on CUDA, transformers takes CUDA-only branches natively")
def test_a_mixture_of_experts_model_trains_on_the_host_runtime_as_on_the_cpu():
    # transformers' MoE layers call histc on integers for every device but
    # cpu and mps; the host runtime's kernels are CPU's, which have none.
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config)
    on_flagos = copy.deepcopy(model).to("flagos")
    ids = torch.randint(0, config.vocab_size, (2, 9))
    cpu = model(ids, labels=ids)
    cpu.loss.backward()
    with flagos_core.trace() as t:
        flagos = on_flagos(ids.to("flagos"), labels=ids.to("flagos"))
        flagos.loss.backward()
    assert t.fallbacks == []
    assert t.counts[("histc", "composite")] == config.num_hidden_layers
    assert torch.equal(flagos.logits.cpu(), cpu.logits)
    for (name, want), got in zip(model.named_parameters(), on_flagos.parameters()):
        assert torch.equal(got.grad.cpu(), want.grad), name


def _cells(device):
    # Self-contained: on an accelerator it runs in a side process. LSTM and
    # GRU cells with and without bias: outputs and gradients, then a second
    # derivative through the hidden state alone (the engine hands the cell's
    # backward an undefined gradient for the cell state).
    results = []
    for cell, bias in (("LSTMCell", True), ("LSTMCell", False), ("GRUCell", True), ("GRUCell", False)):
        torch.manual_seed(0)
        module = getattr(torch.nn, cell)(4, 5, bias=bias).to(device)
        x = torch.randn(3, 4).to(device).requires_grad_()
        out = module(x)
        h = out[0] if isinstance(out, tuple) else out
        (grad,) = torch.autograd.grad(h.square().sum(), x, create_graph=True)
        (second,) = torch.autograd.grad(grad.square().sum(), x)
        results += [h.detach(), grad.detach(), second]
    return results


def test_cells_with_and_without_bias_and_their_second_derivatives(native_device, tmp_path):
    # Both used to raise on the host runtime, through the composite
    # provider's fused cells: without bias (its backwards return no bias
    # gradient: None, an undefined tensor, as CUDA's kernels return), and in
    # a double backward (which hands the cell an undefined cell-state
    # gradient). The host runtime now takes CPU's unfused cells.
    compare_with_native(_cells, native_device, tmp_path)


def _fused_cells(device, with_zero_biases=False):
    # Self-contained: on an accelerator it runs in a side process. The fused
    # cells called directly, without bias (or with zero biases), and their
    # backward.
    torch.manual_seed(0)
    lstm_gates, gru_gates = torch.randn(3, 20).to(device), torch.randn(3, 15).to(device)
    lstm_gates.requires_grad_()
    gru_gates.requires_grad_()
    lstm_biases = [torch.zeros(20).to(device)] * 2 if with_zero_biases else []
    gru_biases = [torch.zeros(15).to(device)] * 2 if with_zero_biases else []
    cx, hx = torch.randn(3, 5).to(device), torch.randn(3, 5).to(device)
    hy, cy, _ = torch.ops.aten._thnn_fused_lstm_cell(lstm_gates, torch.randn(3, 20).to(device), cx, *lstm_biases)
    (hy.sum() + cy.square().sum()).backward()
    h, _ = torch.ops.aten._thnn_fused_gru_cell(gru_gates, torch.randn(3, 15).to(device), hx, *gru_biases)
    h.square().sum().backward()
    return [hy.detach(), cy.detach(), lstm_gates.grad, h.detach(), gru_gates.grad]


def test_fused_cells_without_bias_run_backward(native_device, tmp_path):
    # Served by the composite provider on the host runtime, whose backwards
    # return no bias gradient (None: an undefined tensor, as CUDA's do).
    flagos = _fused_cells(torch.device("flagos"))
    if native_device.type == "cpu":  # the CPU has no fused cells: against flagos's with zero biases
        assert_matches_native(flagos, [t.cpu() for t in _fused_cells(torch.device("flagos"), with_zero_biases=True)])
    else:
        assert_matches_native(flagos, results_on_native(_fused_cells, native_device, tmp_path))
