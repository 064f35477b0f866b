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
    // Arguments by name: the overloads' schemas differ between torch releases.
    const auto& schema = op.schema();
    auto values = torch::jit::pop(*stack, schema.arguments().size());
    Args args{schema, values};
    if (op.operator_name().name == "aten::_scaled_dot_product_flash_attention_for_cpu") {
      forward(args, stack);
    } else {
      backward(args, stack);
    }
  }

 private:
  struct Args {
    const c10::FunctionSchema& schema;
    std::vector<c10::IValue>& values;
    const c10::IValue& operator[](const char* name) const {
      auto index = schema.argumentIndexWithName(name);
      TORCH_CHECK(index.has_value(), "flagos-cuda: ", schema.name(), " has no argument '", name, "' in this torch");
      return values[*index];
    }
    std::optional<double> scale() const {
      return (*this)["scale"].toOptional<double>();
    }
  };

  static void forward(const Args& args, Stack* stack) {
    const at::Tensor q = args["query"].toTensor();
    const double dropout_p = args["dropout_p"].toDouble();
    checkSupported(dropout_p, args["attn_mask"]);
    c10::DeviceGuard guard(q.device());
    auto out = at::_scaled_dot_product_flash_attention(
        native(q), native(args["key"].toTensor()), native(args["value"].toTensor()), dropout_p,
        args["is_causal"].toBool(), false, args.scale());
    const auto index = q.device().index();
    torch::jit::push(*stack, flagos(std::get<0>(out), index), flagos(std::get<1>(out), index));
  }

  static void backward(const Args& args, Stack* stack) {
    const at::Tensor q = args["query"].toTensor();
    const at::Tensor k = args["key"].toTensor();
    const double dropout_p = args["dropout_p"].toDouble();
    checkSupported(dropout_p, args["attn_mask"]);
    c10::DeviceGuard guard(q.device());
    const at::Tensor none;
    const auto empty = at::empty({0}, q.options().device(c10::Device(c10::DeviceType::CUDA, q.device().index())).dtype(at::kLong));
    auto grads = at::_scaled_dot_product_flash_attention_backward(
        native(args["grad_out"].toTensor()), native(q), native(k), native(args["value"].toTensor()),
        native(args["out"].toTensor()), native(args["logsumexp"].toTensor()), none, none, q.size(-2), k.size(-2),
        dropout_p, args["is_causal"].toBool(), empty, empty, args.scale());
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
