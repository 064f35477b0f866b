#pragma once

// Zero-copy relabel: run a native device's kernel on a flagos tensor by
// viewing the same storage as a tensor of the native device type. A fresh
// alias TensorImpl is made per call, so tensors shared between threads are
// never relabelled in place.

#include <flagos/Provider.h>
#include <flagos/Runtime.h>

namespace flagos {

// A native-device alias of a flagos tensor (same StorageImpl, same geometry).
FLAGOS_API at::Tensor toNative(const at::Tensor& flagos_tensor, c10::Device native);
// toNative for a flagos tensor on its device's native device; any other
// tensor (CPU, undefined) as it is.
FLAGOS_API at::Tensor nativeAliasOf(const at::Tensor& t);
// A flagos tensor over `native`'s memory on flagos:<index>, without copying.
FLAGOS_API at::Tensor adoptNative(const at::Tensor& native, c10::DeviceIndex index);

// Serves every overload that has a kernel for the active runtime's native
// dispatch key, through toNative / adoptNative.
class FLAGOS_API RelabelProvider : public KernelProvider {
 public:
  using KernelProvider::KernelProvider;
  bool canServe(const c10::OperatorHandle& op) const override;
  void call(
      const c10::OperatorHandle& op,
      c10::DispatchKeySet keys,
      Stack* stack,
      const OpSlotInfo& info) override;

 protected:
  // Runs the native kernel; a runtime may wrap it (the host runtime points
  // the CPU allocator at device memory for the duration).
  virtual void runNative(
      const c10::OperatorHandle& op,
      Stack* stack,
      c10::DeviceIndex index);
};

} // namespace flagos
