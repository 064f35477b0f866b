// scaled_dot_product_attention on flagos follows the native choice of fused
// kernel (see the core's AttentionChoice.cpp). For the flash choice PyTorch's
// SDPA calls the CPU-named flash overloads on any device but CUDA; this
// provider serves those two overloads with CUDA's flash kernels, the ones
// native CUDA runs for the same call. With dropout, CUDA's forward returns
// the RNG state it drew, which the CPU-named overloads have no place for:
// it is kept here for the backward, under the forward's logsumexp result.

#include "FlashAttention.h"

#include <flagos/Relabel.h>
#include <flagos/Router.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <mutex>
#include <unordered_map>
#include <utility>

namespace flagos::cuda {
namespace {

void checkSupported(const c10::IValue& attn_mask) {
  // CUDA's flash kernels take no mask (its choice never picks them for one).
  // Autograd hands backward a mask that was None in forward as an undefined
  // tensor.
  const bool no_mask = attn_mask.isNone() || (attn_mask.isTensor() && !attn_mask.toTensor().defined());
  TORCH_CHECK(
      no_mask,
      "flagos-cuda: flash attention through flagos takes no attn_mask; choose another SDPA backend with "
      "torch.nn.attention.sdpa_kernel");
}

// The RNG state (philox seed and offset) each forward with dropout drew, for
// its backward: keyed by the forward's logsumexp, which autograd saves and
// hands to the backward. An entry goes when that logsumexp's storage dies
// (swept at the next forward with dropout).
class DropoutStates {
 public:
  void put(const at::Tensor& logsumexp, at::Tensor seed, at::Tensor offset) {
    const c10::Storage& storage = logsumexp.storage();
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.storage.expired() ? entries_.erase(it) : std::next(it);
    }
    entries_.insert_or_assign(
        storage.unsafeGetStorageImpl(), Entry{storage.getWeakStorageImpl(), std::move(seed), std::move(offset)});
  }

  std::pair<at::Tensor, at::Tensor> get(const at::Tensor& logsumexp) {
    c10::StorageImpl* key = logsumexp.storage().unsafeGetStorageImpl();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    TORCH_CHECK(
        it != entries_.end() && it->second.storage.lock().get() == key,
        "flagos-cuda: a flash attention backward with dropout needs the RNG state of its forward, which flagos "
        "keeps with the logsumexp that forward returned; this logsumexp did not come from a flagos forward with "
        "dropout");
    return {it->second.seed, it->second.offset};
  }

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    at::Tensor seed;
    at::Tensor offset;
  };
  std::mutex mutex_;
  std::unordered_map<const c10::StorageImpl*, Entry> entries_;
};

DropoutStates& dropoutStates() {
  static DropoutStates* states = new DropoutStates(); // never destroyed: calls may run at exit
  return *states;
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
    checkSupported(values[arg.attn_mask]);
    c10::DeviceGuard guard(q.device());
    const ScopedNativeAlias nq(q), nk(values[arg.key].toTensor()), nv(values[arg.value].toTensor());
    auto out = at::_scaled_dot_product_flash_attention(
        nq.get(), nk.get(), nv.get(), dropout_p, values[arg.is_causal].toBool(), false,
        values[arg.scale].toOptional<double>());
    const auto index = q.device().index();
    at::Tensor logsumexp = adoptNative(std::move(std::get<1>(out)), index);
    if (dropout_p > 0.0) {
      dropoutStates().put(logsumexp, std::move(std::get<6>(out)), std::move(std::get<7>(out)));
    }
    torch::jit::push(*stack, adoptNative(std::move(std::get<0>(out)), index), std::move(logsumexp));
  }

  static void backward(const BackwardArgs& arg, const std::vector<c10::IValue>& values, Stack* stack) {
    const at::Tensor& q = values[arg.query].toTensor();
    const at::Tensor& k = values[arg.key].toTensor();
    const at::Tensor& logsumexp = values[arg.logsumexp].toTensor();
    const double dropout_p = values[arg.dropout_p].toDouble();
    checkSupported(values[arg.attn_mask]);
    c10::DeviceGuard guard(q.device());
    const at::Tensor none;
    std::pair<at::Tensor, at::Tensor> rng;
    if (dropout_p > 0.0) {
      rng = dropoutStates().get(logsumexp);
    } else {
      rng.first = rng.second =
          at::empty({0}, q.options().device(c10::Device(c10::DeviceType::CUDA, q.device().index())).dtype(at::kLong));
    }
    const ScopedNativeAlias ng(values[arg.grad_out].toTensor()), nq(q), nk(k), nv(values[arg.value].toTensor()),
        no(values[arg.out].toTensor()), nl(logsumexp);
    auto grads = at::_scaled_dot_product_flash_attention_backward(
        ng.get(), nq.get(), nk.get(), nv.get(), no.get(), nl.get(), none, none, q.size(-2), k.size(-2), dropout_p,
        values[arg.is_causal].toBool(), rng.first, rng.second, values[arg.scale].toOptional<double>());
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
