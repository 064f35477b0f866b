// scaled_dot_product_attention picks its fused kernel through a per-device
// stub. For flagos the choice is the active runtime's native one: the native
// device's `_fused_sdp_choice` kernel, asked about native aliases of the
// arguments, so SDPA on flagos takes the same kernel as on the native device.
// Redispatched straight to that kernel, not routed: the native device calls
// its stub directly, and a routed call per attention would cost far more.
// Tensors without memory of their own to alias (torch.compile's FakeTensors,
// functionalization's wrappers) are asked about through stand-ins with their
// geometry and no memory, as the native device's stub is asked about its own
// FakeTensors.

#include <flagos/Relabel.h>
#include <flagos/Runtime.h>

#include "core/Alias.h"
#include "core/CallConstants.h"

#include <ATen/ATen.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/DeviceGuard.h>

namespace flagos {
namespace {

// A native-device tensor with `t`'s sizes, strides (symbolic ones too),
// dtype and gradient flag, over no memory: the choice reads only these.
at::Tensor geometryStandIn(const at::Tensor& t, c10::Device native) {
  c10::Storage nothing(c10::Storage::use_byte_size_t(), 0, at::DataPtr(nullptr, native), nullptr, false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(nothing), detail::keysFor(native), t.dtype());
  impl->set_sizes_and_strides(t.sym_sizes(), t.sym_strides(), t.sym_storage_offset());
  at::Tensor out(std::move(impl));
  if (t.requires_grad()) {
    out.set_requires_grad(true);
  }
  return out;
}

int64_t nativeSdpChoice(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask,
    double dropout_p,
    bool is_causal,
    std::optional<double> scale,
    bool enable_gqa) {
  const detail::CallConstants& c = detail::callConstants();
  c10::OptionalDeviceGuard guard;
  detail::makeCurrent(c, guard, query.device()); // the choice reads the current device's properties
  const bool mask_requires_grad = attn_mask.has_value() && attn_mask->defined() && attn_mask->requires_grad();
  if (C10_UNLIKELY(
          !plainFlagosOrOther(query) || !plainFlagosOrOther(key) || !plainFlagosOrOther(value) ||
          (attn_mask.has_value() && !plainFlagosOrOther(*attn_mask)))) {
    auto standIn = [&c](const at::Tensor& t) {
      return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1
          ? geometryStandIn(t, c.nativeDevice(t.device().index()))
          : t;
    };
    std::optional<at::Tensor> mask;
    if (attn_mask.has_value()) {
      mask = standIn(*attn_mask);
    }
    return at::_ops::_fused_sdp_choice::redispatch(
        c.native_keys, standIn(query), standIn(key), standIn(value), mask, dropout_p, is_causal, scale, enable_gqa);
  }
  if (C10_UNLIKELY(query.requires_grad() || key.requires_grad() || value.requires_grad() || mask_requires_grad)) {
    // The choice reads requires_grad (CPU's flash kernel gives a mask no
    // gradient, so CPU takes the math path then, under no_grad too: a
    // reentrant checkpoint's forward), and pooled aliases, made below
    // autograd, have none: fresh aliases that carry it stand in.
    auto carrying = [](const at::Tensor& t) {
      if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) {
        return t;
      }
      at::Tensor alias = nativeAliasOf(t);
      if (t.requires_grad()) {
        alias.set_requires_grad(true);
      }
      return alias;
    };
    std::optional<at::Tensor> mask;
    if (attn_mask.has_value()) {
      mask = carrying(*attn_mask);
    }
    return at::_ops::_fused_sdp_choice::redispatch(
        c.native_keys, carrying(query), carrying(key), carrying(value), mask, dropout_p, is_causal, scale, enable_gqa);
  }
  const ScopedNativeAlias q(query);
  const ScopedNativeAlias k(key);
  const ScopedNativeAlias v(value);
  const c10::DispatchKeySet keys = c.native_keys;
  if (!attn_mask.has_value()) {
    return at::_ops::_fused_sdp_choice::redispatch(
        keys, q.get(), k.get(), v.get(), std::nullopt, dropout_p, is_causal, scale, enable_gqa);
  }
  const ScopedNativeAlias m(*attn_mask);
  return at::_ops::_fused_sdp_choice::redispatch(
      keys, q.get(), k.get(), v.get(), m.get(), dropout_p, is_causal, scale, enable_gqa);
}

} // namespace
} // namespace flagos

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &flagos::nativeSdpChoice)
} // namespace at::native
