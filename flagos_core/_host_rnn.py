"""`nn.LSTM` and `nn.GRU` on the host runtime take CPU's own paths.

PyTorch decomposes `lstm` and `gru` by the input's device. For a CPU tensor,
`lstm` runs each layer and direction as one oneDNN kernel
(`mkldnn_rnn_layer`, with its own backward), and `gru` computes each layer's
input gates for all steps in one matrix product, then runs an unfused cell
per step. For any other device both go step by step through fused cells,
which only CUDA has (on the host runtime the composite provider's cells
serve them, at about half of CPU's speed). On the host runtime the kernels
are CPU's, so flagos's `lstm` and `gru` take CPU's decompositions, under the
same conditions and with the same ops in the same order, and give the same
results bit for bit. Anything else (projections, float64 LSTMs, packed
sequences) decomposes as PyTorch decomposes it for flagos.

The kernels are registered for AutogradPrivateUse1, where a composite op is
expanded: the ops they call record their own gradients, as CPU's do; and for
PrivateUse1, which inference_mode reaches.
"""

import sys

import torch

_LIBRARY = None


def _takes_onednn(input, hx, params):
    # CPU's condition for its oneDNN RNN (RNN.cpp, use_mkldnn), for a flagos
    # input: every tensor on the input's device, a dtype oneDNN's RNN takes
    # here, no projections (a projected layer has 3 or 5 weights, not 2 or 4).
    if not torch.backends.mkldnn.enabled or input.numel() == 0:
        return False
    if any(t.device != input.device for t in (*hx, *params)):
        return False
    dtype = input.dtype
    if dtype == torch.bfloat16:
        supported = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    elif dtype == torch.float16:
        supported = not torch.is_grad_enabled() and torch.ops.mkldnn._is_mkldnn_fp16_supported()
    else:
        supported = dtype == torch.float32
    return supported and params[0].size(0) == 4 * hx[0].size(2)


def _onednn_lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    h0, c0 = hx[0].contiguous(), hx[1].contiguous()
    hidden_size = h0.size(2)
    per_layer = 4 if has_biases else 2
    directions = 2 if bidirectional else 1
    layer_input = (input.transpose(0, 1) if batch_first else input).contiguous()
    hy, cy = [], []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            w_ih, w_hh, *biases = params[index * per_layer:(index + 1) * per_layer]
            if not has_biases:  # as CPU: zero biases shaped as the weights
                biases = [torch.zeros(w_ih.shape, dtype=w_ih.dtype, device=w_ih.device),
                          torch.zeros(w_hh.shape, dtype=w_hh.dtype, device=w_hh.device)]
            output, h, c, _ = torch.ops.aten.mkldnn_rnn_layer(
                layer_input, w_ih, w_hh, biases[0], biases[1], h0[index], c0[index], direction > 0, [],
                2, hidden_size, num_layers, has_biases, bidirectional, batch_first, train)  # 2: oneDNN's LSTM kind
            outputs.append(output)
            hy.append(h)
            cy.append(c)
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, -1)
        if dropout != 0 and train and layer < num_layers - 1:
            layer_input = torch.dropout(layer_input, dropout, True)
    output = layer_input.transpose(0, 1) if batch_first else layer_input
    return output, torch.stack(hy, 0), torch.stack(cy, 0)


def _gru_layer(inputs, hx, w_ih, w_hh, b_ih, b_hh, reverse):
    # CPU's FullLayer with GRUCell: the input gates of every step in one
    # linear, then per step the unfused cell, in CPU's order of operations.
    steps = torch.nn.functional.linear(inputs, w_ih, b_ih).unbind(0)
    outputs = []
    hidden = hx
    for igates in (reversed(steps) if reverse else steps):
        i_r, i_z, i_n = igates.unsafe_chunk(3, 1)
        h_r, h_z, h_n = torch.nn.functional.linear(hidden, w_hh, b_hh).unsafe_chunk(3, 1)
        reset_gate = h_r.add_(i_r).sigmoid_()
        input_gate = h_z.add_(i_z).sigmoid_()
        new_gate = i_n.add(h_n.mul_(reset_gate)).tanh_()
        hidden = (hidden - new_gate).mul_(input_gate).add_(new_gate)
        outputs.append(hidden)
    if reverse:
        outputs.reverse()
    return torch.stack(outputs, 0), hidden


def _cpu_gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    per_layer = 4 if has_biases else 2
    directions = 2 if bidirectional else 1
    layer_input = input.transpose(0, 1) if batch_first else input
    hiddens = hx.unbind(0)
    final = []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            w_ih, w_hh, *biases = params[index * per_layer:(index + 1) * per_layer]
            b_ih, b_hh = biases if has_biases else (None, None)
            output, hidden = _gru_layer(layer_input, hiddens[index], w_ih, w_hh, b_ih, b_hh, direction > 0)
            outputs.append(output)
            final.append(hidden)
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, outputs[0].dim() - 1)
        if dropout != 0 and train and layer < num_layers - 1:
            layer_input = torch.dropout(layer_input, dropout, True)
    output = layer_input.transpose_(0, 1) if batch_first else layer_input
    return output, torch.stack(final, 0)


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
    args = (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return _onednn_lstm(*args) if _takes_onednn(input, hx, params) else _pytorchs_decomposition(torch.ops.aten.lstm.input, *args)


@_not_traced
def _gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    args = (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    takes_cpus_path = input.numel() > 0 and all(t.device == input.device for t in (hx, *params))
    return _cpu_gru(*args) if takes_cpus_path else _pytorchs_decomposition(torch.ops.aten.gru.input, *args)


def register():
    """Once, when the host runtime is activated."""
    global _LIBRARY
    if _LIBRARY is None:
        library = torch.library.Library("aten", "IMPL")
        for name, kernel in (("lstm.input", _lstm), ("gru.input", _gru)):
            for key in ("AutogradPrivateUse1", "PrivateUse1"):
                library.impl(name, kernel, key)
        _LIBRARY = library
