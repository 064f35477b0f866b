#include "core/ProcessSharing.h"

#include "core/Alias.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace flagos {
namespace {

void checkFlagos(const at::Tensor& t) {
  TORCH_CHECK(t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 && t.has_storage(),
              "flagos: expected a flagos tensor with storage");
}

} // namespace

at::Tensor wrappedNativeBytes(const at::Tensor& flagos) {
  checkFlagos(flagos);
  std::optional<c10::Storage> native = detail::wrappedStorage(flagos.storage());
  if (!native) {
    return {};
  }
  const int64_t bytes = static_cast<int64_t>(native->nbytes());
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(native->device()))
      .set_(*native, 0, {bytes}, {1});
}

void moveStorageOnto(const at::Tensor& flagos, const at::Tensor& bytes) {
  checkFlagos(flagos);
  TORCH_CHECK(bytes.defined() && bytes.is_cpu() && bytes.scalar_type() == at::kByte && bytes.storage_offset() == 0 &&
                  bytes.numel() == static_cast<int64_t>(bytes.storage().nbytes()),
              "flagos: the target must be a CPU byte tensor over a whole storage");
  detail::moveOnto(flagos.storage(), bytes.storage());
}

} // namespace flagos
