#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace flagos {

// CPU's unfused recurrent cells over one layer and direction, step by step,
// for flagos_core/_host_rnn.py: `input_gates` holds every step's input
// gates (steps first), computed beforehand in one linear as PyTorch's
// RNN.cpp does for a CPU tensor. The ATen calls are that file's, in its
// order, so results (and the gradients autograd records) are CPU's bit for
// bit; made from C++, a step costs no Python.
// -> (the outputs stacked in input order, final hidden state).
std::tuple<at::Tensor, at::Tensor> gruSteps(
    const at::Tensor& input_gates,
    at::Tensor hidden,
    const at::Tensor& w_hh,
    const std::optional<at::Tensor>& b_hh,
    bool reverse);

// -> (the outputs stacked in input order, final h, final c); `w_hr` projects h.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstmSteps(
    const at::Tensor& input_gates,
    at::Tensor h,
    at::Tensor c,
    const at::Tensor& w_hh,
    const std::optional<at::Tensor>& b_hh,
    const std::optional<at::Tensor>& w_hr,
    bool reverse);

} // namespace flagos
