// scaled_dot_product_attention picks its fused kernel through a per-device
// stub. For flagos the choice is the active runtime's native one: the native
// device's `_fused_sdp_choice` kernel, asked about native aliases of the
// arguments, so SDPA on flagos takes the same kernel as on the native device.
// Redispatched straight to that kernel, not routed: the native device calls
// its stub directly, and a routed call per attention would cost far more.

#include <flagos/Runtime.h>

#include "core/Alias.h"
#include "core/RelabelCall.h"

#include <ATen/ATen.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/DeviceGuard.h>

namespace flagos {
namespace {

int64_t nativeSdpChoice(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask,
    double dropout_p,
    bool is_causal,
    std::optional<double> scale,
    bool enable_gqa) {
  DeviceRuntime& rt = activeRuntime();
  c10::OptionalDeviceGuard guard;
  if (rt.getDevice() != query.device()) {
    guard.reset_device(query.device()); // the choice reads the current device's properties
  }
  const c10::Device native = rt.nativeDevice(query.device().index());
  const detail::ScopedAlias q(query, native);
  const detail::ScopedAlias k(key, native);
  const detail::ScopedAlias v(value, native);
  const c10::DispatchKeySet keys = detail::nativeKeys();
  if (!attn_mask.has_value()) {
    return at::_ops::_fused_sdp_choice::redispatch(
        keys, q.get(), k.get(), v.get(), std::nullopt, dropout_p, is_causal, scale, enable_gqa);
  }
  const detail::ScopedAlias m(*attn_mask, native);
  return at::_ops::_fused_sdp_choice::redispatch(
      keys, q.get(), k.get(), v.get(), m.get(), dropout_p, is_causal, scale, enable_gqa);
}

} // namespace
} // namespace flagos

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &flagos::nativeSdpChoice)
} // namespace at::native
