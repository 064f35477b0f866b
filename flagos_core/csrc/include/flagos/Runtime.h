#pragma once

// The device runtime interface: what a plugin implements to make `flagos` a
// real device. Exactly one runtime is active per process; the core forwards
// PyTorch's device guard, hooks, allocator and generator calls to it.

#include <flagos/Export.h>

#include <ATen/core/Generator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include <memory>
#include <string>

namespace flagos {

struct DeviceProperties {
  std::string name;
  size_t total_memory = 0;
  int major = 0;
  int minor = 0;
  int multi_processor_count = 0;
};

// A runtime is a device guard (device selection, streams, events) plus memory,
// generators and the native device its memory can be addressed as.
class FLAGOS_API DeviceRuntime : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const final {
    return c10::DeviceType::PrivateUse1;
  }

  virtual std::string name() const = 0;

  // The device type whose kernels can run on this runtime's memory unchanged
  // (CPU for host, CUDA for flagos_cuda), and the dispatch key of its kernels.
  virtual c10::DeviceType nativeDeviceType() const = 0;
  virtual c10::DispatchKey nativeDispatchKey() const = 0;
  c10::Device nativeDevice(c10::DeviceIndex index) const {
    return nativeDeviceOf(nativeDeviceType(), index);
  }
  // The same for a given native device type (CPU has one device, no index).
  static c10::Device nativeDeviceOf(c10::DeviceType native_type, c10::DeviceIndex index) {
    return native_type == c10::DeviceType::CPU ? c10::Device(c10::DeviceType::CPU) : c10::Device(native_type, index);
  }

  // Allocations labelled flagos:<current device>; statistics per device.
  virtual c10::DeviceAllocator* allocator() = 0;
  virtual c10::Allocator* pinnedAllocator() = 0;
  virtual bool isPinnedPtr(const void* ptr) = 0;

  // The device's default generator: best a NativeBackedGenerator over the
  // native device's own default one, which native kernels draw from when an
  // op takes no generator (dropout), so that seeding and saved states cover
  // every draw.
  virtual const at::Generator& defaultGenerator(c10::DeviceIndex index) = 0;
  virtual at::Generator newGenerator(c10::DeviceIndex index) = 0;
  // The generator native kernels accept for a flagos generator (same state).
  virtual at::Generator nativeGenerator(const at::Generator& flagos_gen) = 0;

  virtual DeviceProperties properties(c10::DeviceIndex index) = 0;

  // What torch.accelerator.get_device_capability reports (the dtypes the
  // device supports): by default the native device's answer, since flagos
  // runs the native device's kernels.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override;

#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 11
  // What torch.Stream.native_handle gives for a flagos stream: by default the
  // native device's handle of the same stream (a cudaStream_t on CUDA).
  void* getStreamNativeHandle(const c10::Stream stream) const override;
#endif

  // Error (never a crash) for an index outside [0, deviceCount()).
  void checkIndex(c10::DeviceIndex index) const;
};

// The active runtime; the host runtime unless a plugin's was activated.
FLAGOS_API DeviceRuntime& activeRuntime();
FLAGOS_API bool hasActiveRuntime();
// Makes `runtime` the active one. Only before the first flagos operation.
FLAGOS_API void activateRuntime(std::shared_ptr<DeviceRuntime> runtime);

} // namespace flagos
