#include "core/Autocast.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <memory>
#include <mutex>

namespace flagos {

// An op without a policy runs as it is, as on every device with autocast;
// without this, torch.autocast("flagos") stops every op with "Could not run
// ... with arguments from the 'Autocastflagos' backend".
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

namespace {

std::mutex g_mutex;
std::unique_ptr<torch::Library> g_library; // the policies' registrations, kept for the process
std::string g_device;

// PyTorch's own lists and wrappers (ATen/autocast_mode.h, kept there for
// backends to reuse), registered for PrivateUse1: inputs on flagos are cast
// by the same rules as CUDA's autocast applies to CUDA tensors.
#define FLAGOS_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define FLAGOS_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define FLAGOS_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define FLAGOS_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

using at::Tensor;

// CUDA's autocast refuses binary_cross_entropy (its float16 inputs lose the
// log's range); so does flagos with CUDA's policies.
Tensor binaryCrossEntropyRefused(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(
      false, "flagos: binary_cross_entropy (nn.BCELoss) cannot run under torch.autocast, as under CUDA's: it is ",
      "unsafe in reduced precision. Use binary_cross_entropy_with_logits (nn.BCEWithLogitsLoss), which autocast ",
      "runs in float32, or leave the loss outside the autocast region.");
}

void registerCudaPolicies(torch::Library& m) {
  // The lists name ATen's types unqualified (Tensor, Scalar, IntArrayRef,
  // and up to torch 2.12 DimnameList, which later releases no longer declare).
  using namespace at;
  AT_FORALL_LOWER_PRECISION_FP(FLAGOS_LOWER_PRECISION_FP)
  AT_FORALL_FP32(FLAGOS_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(FLAGOS_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(FLAGOS_PROMOTE)
  m.impl("aten::binary_cross_entropy", TORCH_FN(binaryCrossEntropyRefused));
}

} // namespace

void useAutocastPolicies(const std::string& device) {
  TORCH_CHECK(
      device == "cuda" || device == "cpu", "flagos: no autocast policies for device '", device, "'; known: cpu, cuda");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_library) {
    TORCH_CHECK(
        device == g_device, "flagos: autocast already casts as ", g_device, "; it cannot switch to ", device,
        " in the same process");
    return;
  }
  auto library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", std::make_optional(c10::DispatchKey::AutocastPrivateUse1), __FILE__, __LINE__);
  if (device == "cuda") {
    registerCudaPolicies(*library);
  } else {
    registerCpuPolicies(*library);
    // CPU's autocast casts to bfloat16 unless told otherwise, where PyTorch's
    // default for PrivateUse1 is float16. The default is per thread: this
    // one's (the one that activates the runtime, at import).
    at::autocast::set_autocast_dtype(c10::DeviceType::PrivateUse1, at::kBFloat16);
  }
  g_library = std::move(library);
  g_device = device;
}

std::string autocastPolicies() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_device;
}

} // namespace flagos
