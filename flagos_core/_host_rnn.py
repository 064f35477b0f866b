"""`nn.LSTM`, `nn.GRU` and `nn.RNN` on the host runtime take CPU's own paths.

PyTorch decomposes `lstm`, `gru`, `rnn_tanh` and `rnn_relu` by the input's
device. For a CPU tensor,
`lstm` runs each layer and direction as one oneDNN kernel
(`mkldnn_rnn_layer`, with its own backward) where oneDNN takes it (float32,
no projections); otherwise, and for `gru`, it computes each layer's input
gates for all steps in one matrix product, then runs an unfused cell per
step (`rnn_tanh` and `rnn_relu` likewise). For any other device both go step by step through fused cells, which
only CUDA has (on the host runtime the composite provider's cells serve
them, at about half of CPU's speed). On the host runtime the kernels are
CPU's, so flagos's recurrent layers take CPU's decompositions, under the
same conditions and with the same ops in the same order (the unfused cells'
step loop in C++, csrc/python/RecurrentSteps.cpp), and give the same
results bit for bit. Packed sequences (the `.data` overloads) likewise:
CPU's packed layers, the input gates of every step at once, then the
unfused cell over each step's shrinking (or, reversed, growing) batch.
Tensors on several devices decompose as PyTorch decomposes them for flagos.
`nn.LSTMCell` and `nn.GRUCell` (`lstm_cell`, `gru_cell`) take CPU's unfused
cell too, as one step of the same loop.

The kernels are registered for AutogradPrivateUse1, where a composite op is
expanded: the ops they call record their own gradients, as CPU's do; and for
PrivateUse1, which inference_mode reaches.
"""

import sys

import torch

from . import _C

_LIBRARY = None
F = torch.nn.functional


def _on_one_device(input, hx, params):
    return input.numel() > 0 and all(t.device == input.device for t in (*hx, *params))


def _layer_weights(params, has_biases, projections, index):
    # (w_ih, w_hh, b_ih, b_hh, w_hr) of one layer and direction; None where absent.
    count = (4 if has_biases else 2) + (1 if projections else 0)
    w = params[index * count:(index + 1) * count]
    b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
    return w[0], w[1], b_ih, b_hh, (w[-1] if projections else None)


def _stacked(input, states, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, run_layer,
             projections=False, contiguous=False):
    # CPU's layer stack: layer by layer, each direction's output side by side,
    # dropout between layers; -> (output, the final states stacked per kind).
    # `contiguous`: the input made contiguous once, before the first layer,
    # as CPU's oneDNN stack does (once per direction would put two copies in
    # the graph, and a double backward would sum their gradients otherwise).
    directions = 2 if bidirectional else 1
    layer_input = input.transpose(0, 1) if batch_first else input
    if contiguous:
        layer_input = layer_input.contiguous()
    final = []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            weights = _layer_weights(params, has_biases, projections, index)
            output, state = run_layer(layer_input, [s[index] for s in states], weights, direction > 0)
            outputs.append(output)
            final.append(state)
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, outputs[0].dim() - 1)
        if dropout != 0 and train and layer < num_layers - 1:
            layer_input = torch.dropout(layer_input, dropout, True)
    # Not in place: with one direction this is the layer kernel's own output,
    # which its backward saved (CPU transposes out of place too).
    output = layer_input.transpose(0, 1) if batch_first else layer_input
    return output, [torch.stack(kind, 0) for kind in zip(*final)]


def _takes_onednn(input, projections):
    # CPU's condition for its oneDNN RNN (RNN.cpp, use_mkldnn): a dtype
    # oneDNN's RNN takes here, no projections.
    if not torch.backends.mkldnn.enabled or projections:
        return False
    dtype = input.dtype
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return not torch.is_grad_enabled() and torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return dtype == torch.float32


def _onednn_lstm_layer(num_layers, has_biases, bidirectional, batch_first, train):
    def run(layer_input, state, weights, reverse):
        w_ih, w_hh, b_ih, b_hh, _ = weights
        if not has_biases:  # as CPU: zero biases shaped as the weights
            b_ih = torch.zeros(w_ih.shape, dtype=w_ih.dtype, device=w_ih.device)
            b_hh = torch.zeros(w_hh.shape, dtype=w_hh.dtype, device=w_hh.device)
        h, c = state
        output, hy, cy, _ = torch.ops.aten.mkldnn_rnn_layer(
            layer_input, w_ih, w_hh, b_ih, b_hh, h, c, reverse, [], 2, h.size(-1),  # 2: oneDNN's LSTM
            num_layers, has_biases, bidirectional, batch_first, train)
        return output, (hy, cy)
    return run


def _lstm_layer(layer_input, state, weights, reverse):
    # CPU's FullLayer: the input gates of every step in one linear, then
    # CPU's unfused cell step by step (in C++: a step costs no Python).
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    output, h, c = _C._lstm_steps(F.linear(layer_input, w_ih, b_ih), *state, w_hh, b_hh, w_hr, reverse)
    return output, (h, c)


def _gru_layer(layer_input, state, weights, reverse):
    # As _lstm_layer, with CPU's unfused GRU cell.
    w_ih, w_hh, b_ih, b_hh, _ = weights
    output, hidden = _C._gru_steps(F.linear(layer_input, w_ih, b_ih), *state, w_hh, b_hh, reverse)
    return output, (hidden,)


def _simple_layer(nonlinearity):
    # CPU's FullLayer with its simple cell: the input terms of every step in
    # one linear, then per step nonlinearity(linear(h, w_hh, b_hh) + input
    # term), the reversed direction over the steps in reverse.
    def run(layer_input, state, weights, reverse):
        w_ih, w_hh, b_ih, b_hh, _ = weights
        steps = F.linear(layer_input, w_ih, b_ih).unbind(0)
        hidden, outputs = state[0], []
        for step in (reversed(steps) if reverse else steps):
            hidden = nonlinearity(F.linear(hidden, w_hh, b_hh).add_(step))
            outputs.append(hidden)
        if reverse:
            outputs.reverse()
        return torch.stack(outputs, 0), (hidden,)
    return run


def _packed_layer(cell, batch_sizes):
    # CPU's PackedLayer and ReversedPackedLayer, as a run_layer of _stacked:
    # the input gates of every step in one linear, then `cell` step by step.
    sizes = batch_sizes.tolist()

    def run(layer_input, state, weights, reverse):
        gates = F.linear(layer_input, weights[0], weights[2])
        run_steps = _packed_reversed if reverse else _packed_forward
        return run_steps(gates, sizes, tuple(state), lambda x, h: cell(x, h, weights))
    return run


def _packed_forward(gates, sizes, hidden, step):
    # The batch shrinks as sequences end: their final states are set aside
    # and put back in batch order at the end.
    outputs, finished, offset, last = [], [], 0, sizes[0]
    for size in sizes:
        if size < last:
            finished.append(tuple(h.narrow(0, size, last - size) for h in hidden))
            hidden = tuple(h.narrow(0, 0, size) for h in hidden)
        hidden = step(gates.narrow(0, offset, size), hidden)
        outputs.append(hidden[0])
        offset, last = offset + size, size
    finished.append(hidden)
    finished.reverse()
    return torch.cat(outputs, 0), tuple(torch.cat(kind, 0) for kind in zip(*finished))


def _packed_reversed(gates, sizes, initial, step):
    # From the last step back: the batch grows, taking the initial states of
    # the sequences that join.
    outputs, offset, last = [], gates.size(0), sizes[-1]
    hidden = tuple(h.narrow(0, 0, last) for h in initial)
    for size in reversed(sizes):
        if size > last:
            hidden = tuple(torch.cat([h, h0.narrow(0, last, size - last)], 0) for h, h0 in zip(hidden, initial))
        offset -= size
        hidden = step(gates.narrow(0, offset, size), hidden)
        outputs.append(hidden[0])
        last = size
    outputs.reverse()
    return torch.cat(outputs, 0), hidden


def _lstm_cell_step(gates, state, weights):
    _, w_hh, _, b_hh, w_hr = weights
    _, h, c = _C._lstm_steps(gates.unsqueeze(0), *state, w_hh, b_hh, w_hr, False)
    return h, c


def _gru_cell_step(gates, state, weights):
    _, w_hh, _, b_hh, _ = weights
    return _C._gru_steps(gates.unsqueeze(0), state[0], w_hh, b_hh, False)[1:]


def _simple_cell_step(nonlinearity):
    def step(gates, state, weights):
        _, w_hh, _, b_hh, _ = weights
        return (nonlinearity(F.linear(state[0], w_hh, b_hh).add_(gates)),)
    return step


def _pytorchs_decomposition(op, *args):
    # PyTorch's C++ decomposition, as without these kernels (OpOverload.decompose
    # would take torch._decomp's Python one, which runs other cells).
    return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args)


def _not_traced(kernel):
    # torch.compile must not trace these kernels (it would compile them as
    # frames of their own when a compiled model calls lstm): the LSTM's graph
    # would save the RNN layer's workspace, which the layer does not return
    # when the compiled forward runs without grad. Compiled models then trace
    # the ops as PyTorch decomposes them. Only a process that imported
    # torch._dynamo can be compiling, and importing it takes over a second,
    # so the excluded kernel is made there, on first use.
    excluded = None

    def call(*args):
        nonlocal excluded
        if "torch._dynamo" not in sys.modules:
            return kernel(*args)
        if excluded is None:
            excluded = torch._dynamo.disable(kernel)
        return excluded(*args)

    return call


@_not_traced
def _lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    if not _on_one_device(input, hx, params):
        return _pytorchs_decomposition(torch.ops.aten.lstm.input, input, hx, params, has_biases, num_layers, dropout,
                                       train, bidirectional, batch_first)
    projections = len(params) // (num_layers * (2 if bidirectional else 1)) in (3, 5)
    if _takes_onednn(input, projections):
        h0, c0 = hx[0].contiguous(), hx[1].contiguous()
        layer = _onednn_lstm_layer(num_layers, has_biases, bidirectional, batch_first, train)
        output, (hy, cy) = _stacked(input, (h0, c0), params, has_biases, num_layers, dropout, train, bidirectional,
                                    batch_first, layer, contiguous=True)
        return output, hy, cy
    output, (hy, cy) = _stacked(input, (hx[0].unbind(0), hx[1].unbind(0)), params, has_biases, num_layers, dropout,
                                train, bidirectional, batch_first, _lstm_layer, projections)
    return output, hy, cy


@_not_traced
def _gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    if not _on_one_device(input, (hx,), params):
        return _pytorchs_decomposition(torch.ops.aten.gru.input, input, hx, params, has_biases, num_layers, dropout,
                                       train, bidirectional, batch_first)
    output, (hy,) = _stacked(input, (hx.unbind(0),), params, has_biases, num_layers, dropout, train, bidirectional,
                             batch_first, _gru_layer)
    return output, hy


def _one_hidden(op, run_layer):
    @_not_traced
    def kernel(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        if not _on_one_device(input, (hx,), params):
            return _pytorchs_decomposition(op, input, hx, params, has_biases, num_layers, dropout, train,
                                           bidirectional, batch_first)
        output, (hy,) = _stacked(input, (hx.unbind(0),), params, has_biases, num_layers, dropout, train,
                                 bidirectional, batch_first, run_layer)
        return output, hy
    return kernel


@_not_traced
def _packed_lstm(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional):
    if not _on_one_device(data, hx, params):
        return _pytorchs_decomposition(torch.ops.aten.lstm.data, data, batch_sizes, hx, params, has_biases,
                                       num_layers, dropout, train, bidirectional)
    projections = len(params) // (num_layers * (2 if bidirectional else 1)) in (3, 5)
    output, (hy, cy) = _stacked(data, (hx[0].unbind(0), hx[1].unbind(0)), params, has_biases, num_layers, dropout,
                                train, bidirectional, False, _packed_layer(_lstm_cell_step, batch_sizes), projections)
    return output, hy, cy


def _packed_one_hidden(op, cell):
    @_not_traced
    def kernel(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional):
        if not _on_one_device(data, (hx,), params):
            return _pytorchs_decomposition(op, data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
                                           bidirectional)
        output, (hy,) = _stacked(data, (hx.unbind(0),), params, has_biases, num_layers, dropout, train,
                                 bidirectional, False, _packed_layer(cell, batch_sizes))
        return output, hy
    return kernel


def _cell_shapes_hold(input, hidden, w_ih, w_hh):
    # What the cells' own checks demand; anything else goes to PyTorch's
    # decomposition, whose checks raise their own messages.
    return (input.dim() == 2 and hidden.dim() == 2 and input.size(1) == w_ih.size(1)
            and hidden.size(0) == input.size(0) and hidden.size(1) == w_hh.size(1)
            and all(t.device == input.device for t in (hidden, w_ih, w_hh)))


@_not_traced
def _lstm_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    # nn.LSTMCell: CPU's unfused cell, as one step of the layer's loop
    # (PyTorch fuses it for any device but the CPU; the fused cell has no
    # forward-mode AD and rounds otherwise).
    if len(hx) != 2 or not (_cell_shapes_hold(input, hx[0], w_ih, w_hh) and hx[1].shape == hx[0].shape):
        return _pytorchs_decomposition(torch.ops.aten.lstm_cell.default, input, hx, w_ih, w_hh, b_ih, b_hh)
    _, h, c = _C._lstm_steps(F.linear(input, w_ih, b_ih).unsqueeze(0), hx[0], hx[1], w_hh, b_hh, None, False)
    return h, c


@_not_traced
def _gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    # nn.GRUCell: as _lstm_cell, with CPU's unfused GRU cell.
    if not _cell_shapes_hold(input, hx, w_ih, w_hh):
        return _pytorchs_decomposition(torch.ops.aten.gru_cell.default, input, hx, w_ih, w_hh, b_ih, b_hh)
    _, hidden = _C._gru_steps(F.linear(input, w_ih, b_ih).unsqueeze(0), hx, w_hh, b_hh, False)
    return hidden


def register():
    """Once, when the host runtime is activated."""
    global _LIBRARY
    if _LIBRARY is None:
        library = torch.library.Library("aten", "IMPL")
        kernels = (("lstm.input", _lstm), ("gru.input", _gru),
                   ("rnn_tanh.input", _one_hidden(torch.ops.aten.rnn_tanh.input, _simple_layer(torch.tanh))),
                   ("rnn_relu.input", _one_hidden(torch.ops.aten.rnn_relu.input, _simple_layer(torch.relu))),
                   ("lstm.data", _packed_lstm),
                   ("gru.data", _packed_one_hidden(torch.ops.aten.gru.data, _gru_cell_step)),
                   ("rnn_tanh.data", _packed_one_hidden(torch.ops.aten.rnn_tanh.data, _simple_cell_step(torch.tanh))),
                   ("rnn_relu.data", _packed_one_hidden(torch.ops.aten.rnn_relu.data, _simple_cell_step(torch.relu))),
                   ("lstm_cell", _lstm_cell), ("gru_cell", _gru_cell))
        for name, kernel in kernels:
            for key in ("AutogradPrivateUse1", "PrivateUse1"):
                library.impl(name, kernel, key)
        _LIBRARY = library
