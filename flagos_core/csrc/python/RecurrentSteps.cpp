#include "python/RecurrentSteps.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace flagos {
namespace {

// Each step's input gates, in the order the layer visits them.
std::vector<at::Tensor> stepsInOrder(const at::Tensor& input_gates, bool reverse) {
  std::vector<at::Tensor> steps = input_gates.unbind(0);
  if (reverse) {
    std::reverse(steps.begin(), steps.end());
  }
  return steps;
}

at::Tensor stackedInInputOrder(std::vector<at::Tensor>& outputs, bool reverse) {
  if (reverse) {
    std::reverse(outputs.begin(), outputs.end());
  }
  return at::stack(outputs, 0);
}

} // namespace

std::tuple<at::Tensor, at::Tensor> gruSteps(
    const at::Tensor& input_gates,
    at::Tensor hidden,
    const at::Tensor& w_hh,
    const std::optional<at::Tensor>& b_hh,
    bool reverse) {
  std::vector<at::Tensor> outputs;
  for (const auto& igates : stepsInOrder(input_gates, reverse)) {
    const auto i = igates.unsafe_chunk(3, 1);
    const auto h = at::linear(hidden, w_hh, b_hh).unsafe_chunk(3, 1);
    const auto reset_gate = h[0].add_(i[0]).sigmoid_();
    const auto input_gate = h[1].add_(i[1]).sigmoid_();
    const auto new_gate = i[2].add(h[2].mul_(reset_gate)).tanh_();
    hidden = (hidden - new_gate).mul_(input_gate).add_(new_gate);
    outputs.push_back(hidden);
  }
  return {stackedInInputOrder(outputs, reverse), hidden};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstmSteps(
    const at::Tensor& input_gates,
    at::Tensor h,
    at::Tensor c,
    const at::Tensor& w_hh,
    const std::optional<at::Tensor>& b_hh,
    const std::optional<at::Tensor>& w_hr,
    bool reverse) {
  std::vector<at::Tensor> outputs;
  for (const auto& igates : stepsInOrder(input_gates, reverse)) {
    const auto gates = at::linear(h, w_hh, b_hh).add_(igates).unsafe_chunk(4, 1);
    const auto in_gate = gates[0].sigmoid_();
    const auto forget_gate = gates[1].sigmoid_();
    const auto cell_gate = gates[2].tanh_();
    const auto out_gate = gates[3].sigmoid_();
    c = (forget_gate * c).add_(in_gate * cell_gate);
    h = out_gate * c.tanh();
    if (w_hr.has_value()) {
      h = at::linear(h, *w_hr);
    }
    outputs.push_back(h);
  }
  return {stackedInInputOrder(outputs, reverse), h, c};
}

} // namespace flagos
