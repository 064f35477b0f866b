"""nn.LSTM and nn.GRU on the host runtime take CPU's own decompositions
(flagos_core/_host_rnn.py): oneDNN's RNN layer per layer and direction for
a float32 LSTM; otherwise the input gates of all steps at once and an
unfused cell per step; packed sequences through CPU's packed layers.
Outputs and gradients are bitwise equal to CPU's."""

import pytest
import torch

import flagos_core

pytestmark = pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host runtime's recurrent layers")

CASES = {
    "one layer": {},
    "without bias": {"bias": False},
    "2 layers, bidirectional, batch first": {"num_layers": 2, "bidirectional": True, "batch_first": True},
    # one direction: the last layer's own output is what comes back
    "batch first": {"batch_first": True},
    "3 layers with dropout": {"num_layers": 3, "dropout": 0.5},
}


def _pair(layer, **kwargs):
    torch.manual_seed(0)
    cpu = getattr(torch.nn, layer)(12, 16, **kwargs)
    flagos = getattr(torch.nn, layer)(12, 16, **kwargs)
    flagos.load_state_dict(cpu.state_dict())
    return cpu, flagos.to("flagos")


def _run(module, device, x, hx):
    # Output, final state(s), then the gradients of the input, the given
    # state and the parameters.
    x = x.to(device, copy=True).requires_grad_()
    hx = tuple(h.to(device, copy=True).requires_grad_() for h in hx) if hx else None
    torch.manual_seed(1)  # dropout's masks
    y, state = module(x, hx if hx is None or len(hx) == 2 else hx[0])
    state = state if isinstance(state, tuple) else (state,)
    (y.square().sum() + sum(s.sum() for s in state)).backward()
    return [y, *state, x.grad, *(h.grad for h in hx or ())] + [p.grad for p in module.parameters()]


@pytest.mark.parametrize("with_state", [False, True], ids=["zero state", "given state"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_recurrent_layer_equals_cpu_bitwise_through_cpus_decomposition(layer, case, with_state):
    cpu, flagos = _pair(layer, **CASES[case])
    x = torch.randn(3, 5, 12)
    directions = 2 if cpu.bidirectional else 1
    batch = x.size(0) if cpu.batch_first else x.size(1)
    states = 2 if layer == "LSTM" else 1
    hx = tuple(torch.randn(cpu.num_layers * directions, batch, 16) for _ in range(states)) if with_state else None
    want = _run(cpu, "cpu", x, hx)
    with flagos_core.trace() as t:
        got = _run(flagos, "flagos", x, hx)
    assert t.fallbacks == []
    assert not any("fused" in name for name, _ in t.counts)  # not the step-by-step fused cells
    if layer == "LSTM":
        assert t.counts[("mkldnn_rnn_layer", "host")] == cpu.num_layers * directions
        assert t.counts[("mkldnn_rnn_layer_backward", "host")] == cpu.num_layers * directions
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g.cpu(), w), f"result {i}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layer,kwargs", [
    ("LSTM", {}),
    ("LSTM", {"proj_size": 5, "num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("GRU", {"num_layers": 2}),
], ids=["lstm", "lstm with projections", "gru"])
def test_other_dtypes_and_projections_equal_cpu_bitwise(layer, kwargs, dtype):
    # Where CPU's oneDNN RNN does not take an LSTM (projections; float64;
    # float16 with grad), CPU runs the unfused cells, and so does flagos.
    cpu, flagos = _pair(layer, **kwargs)
    cpu.to(dtype)
    flagos.to(dtype)
    x = torch.randn(3, 5, 12, dtype=dtype)
    want = _run(cpu, "cpu", x, None)
    with flagos_core.trace() as t:
        got = _run(flagos, "flagos", x, None)
    assert not any("fused" in name for name, _ in t.counts)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g.cpu(), w), f"result {i}"


PACKED_CASES = {
    "one layer": {},
    "2 layers, bidirectional": {"num_layers": 2, "bidirectional": True},
    "3 layers with dropout, without bias": {"num_layers": 3, "dropout": 0.5, "bias": False},
    "batch first": {"batch_first": True},
}


@pytest.mark.parametrize("case", PACKED_CASES)
@pytest.mark.parametrize("layer", ["LSTM", "GRU", "RNN"])
def test_packed_sequences_equal_cpu_bitwise_through_cpus_packed_layers(layer, case):
    # CPU's packed layers: the input gates of every step at once, then the
    # unfused cell over each step's batch (shrinking forwards, growing in
    # reverse); PyTorch's decomposition for other devices runs the fused
    # cells, which round otherwise.
    kwargs = PACKED_CASES[case]
    cpu, flagos = _pair(layer, **kwargs)
    directions = 2 if cpu.bidirectional else 1
    x = torch.randn(3, 5, 12) if cpu.batch_first else torch.randn(5, 3, 12)
    lengths = torch.tensor([5, 3, 2])
    states = 2 if layer == "LSTM" else 1
    hx = tuple(torch.randn(cpu.num_layers * directions, 3, 16) for _ in range(states))

    def run(module, device):
        x_ = x.to(device, copy=True).requires_grad_()
        hx_ = tuple(h.to(device, copy=True).requires_grad_() for h in hx)
        packed = torch.nn.utils.rnn.pack_padded_sequence(x_, lengths, batch_first=cpu.batch_first)
        torch.manual_seed(1)  # dropout's masks
        y, state = module(packed, hx_ if layer == "LSTM" else hx_[0])
        state = state if isinstance(state, tuple) else (state,)
        (y.data.square().sum() + sum(s.sum() for s in state)).backward()
        return [y.data, *state, x_.grad, *(h.grad for h in hx_)] + [p.grad for p in module.parameters()]

    want = run(cpu, "cpu")
    with flagos_core.trace() as t:
        got = run(flagos, "flagos")
    assert t.fallbacks == []
    assert not any("fused" in name for name, _ in t.counts)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g.cpu(), w), f"result {i}"


def test_packed_lstm_with_projections_equals_cpu_bitwise():
    cpu, flagos = _pair("LSTM", proj_size=5, num_layers=2, bidirectional=True)
    x = torch.randn(4, 3, 12)
    lengths = [4, 4, 1]
    want = cpu(torch.nn.utils.rnn.pack_padded_sequence(x, lengths))
    got = flagos(torch.nn.utils.rnn.pack_padded_sequence(x.to("flagos"), lengths))
    assert torch.equal(got[0].data.cpu(), want[0].data)
    for g, w in zip(got[1], want[1]):
        assert torch.equal(g.cpu(), w)


def test_an_empty_sequence_is_refused_as_on_the_cpu():
    for layer in ("LSTM", "GRU"):
        cpu, flagos = _pair(layer)
        with pytest.raises(RuntimeError, match="sequence length"):
            cpu(torch.randn(0, 2, 12))
        with pytest.raises(RuntimeError, match="sequence length"):
            flagos(torch.randn(0, 2, 12, device="flagos"))


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_under_no_grad_and_inference_mode(layer):
    cpu, flagos = _pair(layer)
    x = torch.randn(5, 3, 12)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            assert torch.equal(flagos(x.to("flagos"))[0].cpu(), cpu(x)[0])


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_compiled_layer_trains_as_on_the_cpu(layer):
    # torch.compile (aot_eager: inductor has no flagos code generation) runs
    # the host runtime's layers as they run eagerly.
    cpu, flagos = _pair(layer)
    x = torch.randn(4, 2, 12)
    want = cpu(x)[0]
    want.square().sum().backward()
    got = torch.compile(flagos, backend="aot_eager")(x.to("flagos"))[0]
    got.square().sum().backward()
    assert torch.equal(got.cpu(), want)
    for p, q in zip(flagos.parameters(), cpu.parameters()):
        assert torch.equal(p.grad.cpu(), q.grad)


@pytest.mark.parametrize("cell", ["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("bias", [True, False])
def test_cells_take_cpus_unfused_cell(cell, bias):
    # Outputs, gradients, forward-mode tangents (the fused cell had none)
    # and an unbatched call: bitwise CPU's.
    import torch.autograd.forward_ad as fwAD

    torch.manual_seed(0)
    cpu = getattr(torch.nn, cell)(4, 5, bias=bias)
    flagos = getattr(torch.nn, cell)(4, 5, bias=bias)
    flagos.load_state_dict(cpu.state_dict())
    flagos.to("flagos")
    x = torch.randn(3, 4)

    def run(module, device):
        first = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731
        xi = x.to(device).requires_grad_()
        h = first(module(xi))
        h.square().sum().backward()
        with fwAD.dual_level():
            tangent = fwAD.unpack_dual(first(module(fwAD.make_dual(x.to(device), torch.ones_like(x).to(device))))).tangent
        return [h.detach(), xi.grad, *(p.grad for p in module.parameters()), tangent, first(module(x[0].to(device)))]

    with flagos_core.trace() as t:
        got = run(flagos, "flagos")
    assert not any(op.startswith("_thnn_fused") for (op, _) in t.counts)
    for a, b in zip(got, run(cpu, "cpu")):
        assert torch.equal(a.detach().cpu(), b.detach())


def test_double_backward_through_a_bidirectional_batch_first_lstm_equals_cpu():
    # CPU's oneDNN stack makes the transposed input contiguous once, before
    # its layers; once per direction put two copies in the graph, and the
    # second derivative summed otherwise (7e-9 apart).
    cpu, flagos = _pair("LSTM", bidirectional=True, batch_first=True)

    def run(module, device):
        torch.manual_seed(2)
        x = torch.randn(2, 5, 12).to(device).requires_grad_()
        g, = torch.autograd.grad(module(x)[0].square().sum(), x, create_graph=True)
        g.sum().backward()
        return x.grad

    assert torch.equal(run(flagos, "flagos").cpu(), run(cpu, "cpu"))
