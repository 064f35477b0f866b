// scaled_dot_product_attention picks its fused kernel through a per-device
// stub. For flagos the choice is the active runtime's native one: the
// `_fused_sdp_choice` overload, routed like any other, answers it, so SDPA on
// flagos takes the same kernel as on the native device.

#include <ATen/ATen.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>

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
  return at::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

} // namespace
} // namespace flagos

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &flagos::nativeSdpChoice)
} // namespace at::native
