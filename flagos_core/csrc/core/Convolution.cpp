// Convolution on flagos: PyTorch sends convolutions of devices it does not
// know to the `*_overrideable` overloads. The core answers them with the
// native device's own convolution on zero-copy aliases, so the native backend
// selection (mkldnn, cuDNN, ...) and its results are the native device's.

#include <flagos/Relabel.h>
#include <flagos/Runtime.h>

#include "core/RelabelCall.h"
#include "core/RouterInternal.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>

namespace flagos {
namespace {

// A result as a flagos tensor: relabelled in place when the kernel made it
// for this call alone, as the router's results are.
at::Tensor back(at::Tensor&& t, c10::DeviceIndex index) {
  return t.defined() ? adoptNative(std::move(t), index) : t;
}

// The native kernel's bracket, as the router's relabelled calls have it: the
// host runtime allocates the results in device memory meanwhile, so they
// count in torch.flagos.memory_* (outside it they came from the CPU's heap).
class ConvolutionScope {
 public:
  explicit ConvolutionScope(c10::DeviceIndex index) {
    if (RelabelProvider* provider = detail::defaultRelabelProvider()) {
      scope_.emplace(*provider, index);
    }
  }

 private:
  std::optional<NativeScope> scope_;
};

// A convolution's tensors must share the input's device, as the router
// checks any call's: the native kernel sees aliases of the native device
// only, and took a CPU weight, or another flagos device's, as its own.
void checkSameDevice(const at::Tensor& input, const at::Tensor& other, const char* argument, const char* op) {
  if (other.defined() && other.device() != input.device()) {
    detail::mixedDevices(input.device(), other.device(), argument, std::string("aten::") + op);
  }
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
  checkSameDevice(input, weight, "weight", "convolution_overrideable");
  if (bias.has_value()) {
    checkSameDevice(input, *bias, "bias", "convolution_overrideable");
  }
  c10::DeviceGuard guard(input.device());
  // Pooled aliases for the call, as the router's kernels take (an alias
  // that outlives a call costs a registration: followExports).
  const ScopedNativeAlias native_input(input);
  const ScopedNativeAlias native_weight(weight);
  static const at::Tensor kNoBias;
  const ScopedNativeAlias native_bias(bias.has_value() ? *bias : kNoBias); // both lvalues: no copy to outlive
  at::Tensor out;
  {
    const ConvolutionScope scope(input.device().index());
    out = at::convolution(
        native_input.get(), native_weight.get(),
        bias.has_value() ? std::optional<at::Tensor>(native_bias.get()) : std::nullopt, stride, padding, dilation,
        transposed, output_padding, groups);
  }
  return back(std::move(out), input.device().index());
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
  checkSameDevice(input, weight, "weight", "convolution_backward_overrideable");
  checkSameDevice(input, grad_output, "grad_output", "convolution_backward_overrideable");
  c10::DeviceGuard guard(input.device());
  std::optional<at::IntArrayRef> bias_sizes;
  std::vector<int64_t> bias_size;
  if (output_mask[2]) {
    bias_size = {transposed ? weight.size(1) * groups : weight.size(0)};
    bias_sizes = bias_size;
  }
  const ScopedNativeAlias native_grad(grad_output);
  const ScopedNativeAlias native_input(input);
  const ScopedNativeAlias native_weight(weight);
  std::tuple<at::Tensor, at::Tensor, at::Tensor> grads;
  {
    const ConvolutionScope scope(input.device().index());
    grads = at::convolution_backward(
        native_grad.get(), native_input.get(), native_weight.get(), bias_sizes, stride, padding, dilation, transposed,
        output_padding, groups, output_mask);
  }
  const auto index = input.device().index();
  return {back(std::move(std::get<0>(grads)), index), back(std::move(std::get<1>(grads)), index),
          back(std::move(std::get<2>(grads)), index)};
}

} // namespace
} // namespace flagos

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(flagos::convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(flagos::convolutionBackward));
}
