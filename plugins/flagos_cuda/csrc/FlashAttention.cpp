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

void checkSupported(double dropout_p, const c10::IValue& attn_mask) {
  // The CPU-named overloads carry no RNG state from forward to backward, and
  // CUDA's flash kernels take no mask. Autograd hands backward a mask that
  // was None in forward as an undefined tensor.
  const bool no_mask = attn_mask.isNone() || (attn_mask.isTensor() && !attn_mask.toTensor().defined());
  TORCH_CHECK(
      dropout_p == 0.0 && no_mask,
      "flagos-cuda: flash attention through flagos needs dropout_p == 0 and no attn_mask (got dropout_p=",
      dropout_p, ", attn_mask ", no_mask ? "none" : "given",
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
    const auto& schema = op.schema();
    auto values = torch::jit::pop(*stack, schema.arguments().size());
    if (op.operator_name().name == "aten::_scaled_dot_product_flash_attention_for_cpu") {
      static const ForwardArgs arg(schema); // a schema does not change within a process
      forward(arg, values, stack);
    } else {
      static const BackwardArgs arg(schema);
      backward(arg, values, stack);
    }
  }

 private:
  // Arguments by name, looked up once: the overloads' schemas differ between
  // torch releases.
  static size_t indexOf(const c10::FunctionSchema& schema, const char* name) {
    auto index = schema.argumentIndexWithName(name);
    TORCH_CHECK(index.has_value(), "flagos-cuda: ", schema.name(), " has no argument '", name, "' in this torch");
    return *index;
  }

  struct ForwardArgs {
    explicit ForwardArgs(const c10::FunctionSchema& s)
        : query(indexOf(s, "query")), key(indexOf(s, "key")), value(indexOf(s, "value")),
          dropout_p(indexOf(s, "dropout_p")), is_causal(indexOf(s, "is_causal")),
          attn_mask(indexOf(s, "attn_mask")), scale(indexOf(s, "scale")) {}
    size_t query, key, value, dropout_p, is_causal, attn_mask, scale;
  };

  struct BackwardArgs : ForwardArgs {
    explicit BackwardArgs(const c10::FunctionSchema& s)
        : ForwardArgs(s), grad_out(indexOf(s, "grad_out")), out(indexOf(s, "out")),
          logsumexp(indexOf(s, "logsumexp")) {}
    size_t grad_out, out, logsumexp;
  };

  // Arguments as pooled native aliases (no allocation; `values` holds the
  // flagos tensors meanwhile), fresh results taken over as flagos tensors.
  static void forward(const ForwardArgs& arg, const std::vector<c10::IValue>& values, Stack* stack) {
    const at::Tensor& q = values[arg.query].toTensor();
    const double dropout_p = values[arg.dropout_p].toDouble();
    checkSupported(dropout_p, values[arg.attn_mask]);
    c10::DeviceGuard guard(q.device());
    const ScopedNativeAlias nq(q), nk(values[arg.key].toTensor()), nv(values[arg.value].toTensor());
    auto out = at::_scaled_dot_product_flash_attention(
        nq.get(), nk.get(), nv.get(), dropout_p, values[arg.is_causal].toBool(), false,
        values[arg.scale].toOptional<double>());
    const auto index = q.device().index();
    torch::jit::push(
        *stack, adoptNative(std::move(std::get<0>(out)), index), adoptNative(std::move(std::get<1>(out)), index));
  }

  static void backward(const BackwardArgs& arg, const std::vector<c10::IValue>& values, Stack* stack) {
    const at::Tensor& q = values[arg.query].toTensor();
    const at::Tensor& k = values[arg.key].toTensor();
    const double dropout_p = values[arg.dropout_p].toDouble();
    checkSupported(dropout_p, values[arg.attn_mask]);
    c10::DeviceGuard guard(q.device());
    const at::Tensor none;
    const auto empty = at::empty({0}, q.options().device(c10::Device(c10::DeviceType::CUDA, q.device().index())).dtype(at::kLong));
    const ScopedNativeAlias ng(values[arg.grad_out].toTensor()), nq(q), nk(k), nv(values[arg.value].toTensor()),
        no(values[arg.out].toTensor()), nl(values[arg.logsumexp].toTensor());
    auto grads = at::_scaled_dot_product_flash_attention_backward(
        ng.get(), nq.get(), nk.get(), nv.get(), no.get(), nl.get(), none, none, q.size(-2), k.size(-2), dropout_p,
        values[arg.is_causal].toBool(), empty, empty, values[arg.scale].toOptional<double>());
    const auto index = q.device().index();
    torch::jit::push(
        *stack, adoptNative(std::move(std::get<0>(grads)), index), adoptNative(std::move(std::get<1>(grads)), index),
        adoptNative(std::move(std::get<2>(grads)), index));
  }
};

} // namespace

void registerFlashAttentionProvider() {
  registerProvider(std::make_shared<FlashAttentionProvider>());
}

} // namespace flagos::cuda
