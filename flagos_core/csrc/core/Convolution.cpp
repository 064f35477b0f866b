// Convolution on flagos: PyTorch sends convolutions of devices it does not
// know to the `*_overrideable` overloads. The core answers them with the
// native device's own convolution on zero-copy aliases, so the native backend
// selection (mkldnn, cuDNN, ...) and its results are the native device's.

#include <flagos/Relabel.h>
#include <flagos/Runtime.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace flagos {
namespace {

at::Tensor back(const at::Tensor& t, c10::DeviceIndex index) {
  return t.defined() ? adoptNative(t, index) : t;
}

at::Tensor convolution(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    bool transposed,
    c10::IntArrayRef output_padding,
    int64_t groups) {
  c10::DeviceGuard guard(input.device());
  std::optional<at::Tensor> native_bias = bias.has_value() ? std::optional<at::Tensor>(nativeAliasOf(*bias)) : std::nullopt;
  at::Tensor out = at::convolution(
      nativeAliasOf(input), nativeAliasOf(weight), native_bias, stride, padding, dilation, transposed, output_padding, groups);
  return back(out, input.device().index());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolutionBackward(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& weight,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    bool transposed,
    c10::IntArrayRef output_padding,
    int64_t groups,
    std::array<bool, 3> output_mask) {
  c10::DeviceGuard guard(input.device());
  std::optional<at::IntArrayRef> bias_sizes;
  std::vector<int64_t> bias_size;
  if (output_mask[2]) {
    bias_size = {transposed ? weight.size(1) * groups : weight.size(0)};
    bias_sizes = bias_size;
  }
  auto grads = at::convolution_backward(
      nativeAliasOf(grad_output), nativeAliasOf(input), nativeAliasOf(weight), bias_sizes, stride, padding, dilation, transposed,
      output_padding, groups, output_mask);
  const auto index = input.device().index();
  return {back(std::get<0>(grads), index), back(std::get<1>(grads), index), back(std::get<2>(grads), index)};
}

} // namespace
} // namespace flagos

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(flagos::convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(flagos::convolutionBackward));
}
