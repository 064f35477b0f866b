// `tensor.data = other` between flagos and another dense device, as PyTorch
// allows between CPU and CUDA: `param.data = param.to(device)` is how much
// model code (and FSDP2's fully_shard) moves parameters in place.
//
// set_data asks _has_compatible_shallow_copy_type first, whose dense-backend
// list is PyTorch's own devices, PrivateUse1 not among them, so a CPU tensor
// given flagos data (or the other way round) was refused. Here flagos's
// strided tensors count as dense too; everything else keeps PyTorch's answer.

#include <ATen/ATen.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/library.h>

namespace flagos {
namespace {

bool isDense(c10::DispatchKeySet keys) {
  constexpr auto kDenseBackends = c10::DispatchKeySet(
      {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit, c10::BackendComponent::MPSBit,
       c10::BackendComponent::HIPBit, c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
       c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
  return keys.has(c10::DispatchKey::Dense) && keys.has_any(kDenseBackends);
}

bool compatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
      (isDense(self.key_set()) && isDense(from.key_set()));
}

} // namespace
} // namespace flagos

// Both keys: the autograd one outside inference mode, the backend one inside.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(flagos::compatibleShallowCopyType));
}
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(flagos::compatibleShallowCopyType));
}
