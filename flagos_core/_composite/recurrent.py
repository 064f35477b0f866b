"""LSTM and GRU cells as CUDA fuses them (`_thnn_fused_lstm_cell`,
`_thnn_fused_gru_cell` and their backwards), written with ATen ops: each
cell saves the workspace CUDA's does, so each forward and backward work as a
pair."""

import torch


def _add_biases(gates, input_bias, hidden_bias):
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    return gates


def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    # -> (hy, cy, workspace): the gates after their activations, [i | f | g | o].
    gates = _add_biases(input_gates + hidden_gates, input_bias, hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat((i, f, g, o), 1)


def fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    # -> (grad of the gates, grad of cx, grad of the bias or undefined)
    i, f, g, o = workspace.chunk(4, 1)
    grad_hy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    grad_cy = torch.zeros_like(cy) if grad_cy is None else grad_cy
    tanh_cy = cy.tanh()
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy) + grad_cy
    grad_gates = torch.cat((
        grad_c * g * (1 - i) * i,
        grad_c * cx * (1 - f) * f,
        grad_c * i * (1 - g * g),
        grad_hy * tanh_cy * (1 - o) * o,
    ), 1)
    return grad_gates, grad_c * f, grad_gates.sum(0) if has_bias else None


def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    # -> (hy, workspace): [r | z | n | hx | the hidden gate of n with its bias].
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    bir, biz, bin_ = input_bias.chunk(3) if input_bias is not None else (None, None, None)
    bhr, bhz, bhn = hidden_bias.chunk(3) if hidden_bias is not None else (None, None, None)
    r = _add_biases(ir + hr, bir, bhr).sigmoid()
    z = _add_biases(iz + hz, biz, bhz).sigmoid()
    hn = hn if bhn is None else hn + bhn
    n = ((in_ if bin_ is None else in_ + bin_) + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat((r, z, n, hx, hn), 1)


def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    # -> (grad of the input gates, of the hidden gates, of hx, of the two biases)
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_z = grad_hy * (hx - n) * (1 - z) * z
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * (1 - r) * r
    grad_input = torch.cat((grad_r, grad_z, grad_n), 1)
    grad_hidden = torch.cat((grad_r, grad_z, grad_n * r), 1)
    if not has_bias:
        return grad_input, grad_hidden, grad_hy * z, None, None
    return grad_input, grad_hidden, grad_hy * z, grad_input.sum(0), grad_hidden.sum(0)
