// scaled_dot_product_attention on flagos follows the native choice of fused
// kernel (see the core's AttentionChoice.cpp). For the flash choice PyTorch's
// SDPA calls the CPU-named flash overloads on any device but CUDA; this
// provider serves those two overloads with CUDA's flash kernels, the ones
// native CUDA runs for the same call.

#include "FlashAttention.h"

#include <flagos/Relabel.h>
#include <flagos/Router.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

namespace flagos::cuda {
namespace {

at::Tensor native(const at::Tensor& t) {
  return toNative(t, c10::Device(c10::DeviceType::CUDA, t.device().index()));
}

at::Tensor flagos(const at::Tensor& t, c10::DeviceIndex index) {
  return adoptNative(t, index);
}

void checkSupported(double dropout_p, const c10::IValue& attn_mask) {
  // The CPU-named overloads carry no RNG state from forward to backward, and
  // CUDA's flash kernels take no mask.
  TORCH_CHECK(
      dropout_p == 0.0 && attn_mask.isNone(),
      "flagos-cuda: flash attention through flagos needs dropout_p == 0 and no attn_mask (got dropout_p=",
      dropout_p, ", attn_mask ", attn_mask.isNone() ? "none" : "given",
      "); choose another SDPA backend with torch.nn.attention.sdpa_kernel");
}

class FlashAttentionProvider final : public KernelProvider {
 public:
  FlashAttentionProvider() : KernelProvider("cuda_flash") {}

  bool canServe(const c10::OperatorHandle& op) const override {
    const auto& name = op.operator_name().name;
    return name == "aten::_scaled_dot_product_flash_attention_for_cpu" ||
        name == "aten::_scaled_dot_product_flash_attention_for_cpu_backward";
  }

  void call(const c10::OperatorHandle& op, c10::DispatchKeySet, Stack* stack, const OpSlotInfo&) override {
    if (op.operator_name().name == "aten::_scaled_dot_product_flash_attention_for_cpu") {
      forward(stack);
    } else {
      backward(stack);
    }
  }

 private:
  // (query, key, value, dropout_p, is_causal, *, attn_mask, scale) -> (output, logsumexp)
  static void forward(Stack* stack) {
    auto args = torch::jit::pop(*stack, 7);
    const at::Tensor q = args[0].toTensor();
    const double dropout_p = args[3].toDouble();
    checkSupported(dropout_p, args[5]);
    c10::DeviceGuard guard(q.device());
    auto out = at::_scaled_dot_product_flash_attention(
        native(q), native(args[1].toTensor()), native(args[2].toTensor()), dropout_p, args[4].toBool(), false,
        args[6].toOptional<double>());
    const auto index = q.device().index();
    torch::jit::push(*stack, flagos(std::get<0>(out), index), flagos(std::get<1>(out), index));
  }

  // (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale)
  //   -> (grad_query, grad_key, grad_value)
  static void backward(Stack* stack) {
    auto args = torch::jit::pop(*stack, 10);
    const at::Tensor q = args[1].toTensor();
    const at::Tensor k = args[2].toTensor();
    const double dropout_p = args[6].toDouble();
    checkSupported(dropout_p, args[8]);
    c10::DeviceGuard guard(q.device());
    const at::Tensor none;
    const auto empty = at::empty({0}, q.options().device(c10::Device(c10::DeviceType::CUDA, q.device().index())).dtype(at::kLong));
    auto grads = at::_scaled_dot_product_flash_attention_backward(
        native(args[0].toTensor()), native(q), native(k), native(args[3].toTensor()), native(args[4].toTensor()),
        native(args[5].toTensor()), none, none, q.size(-2), k.size(-2), dropout_p, args[7].toBool(), empty, empty,
        args[9].toOptional<double>());
    const auto index = q.device().index();
    torch::jit::push(
        *stack, flagos(std::get<0>(grads), index), flagos(std::get<1>(grads), index), flagos(std::get<2>(grads), index));
  }
};

} // namespace

void registerFlashAttentionProvider() {
  registerProvider(std::make_shared<FlashAttentionProvider>());
}

} // namespace flagos::cuda
