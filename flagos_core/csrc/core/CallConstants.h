#pragma once

// What every relabelled call reads that is fixed once the runtime is chosen,
// in one cache line (internal to the core). In a model, dozens of other ops
// run between two calls of the same flagos kernel and evict its data: these
// values as separate statics, each with its own guard, missed one by one.

#include <flagos/Runtime.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/macros/Macros.h>

#include <atomic>

namespace flagos::detail {

struct alignas(64) CallConstants {
  std::atomic<bool> ready{false};
  // One device for the whole process (the runtime is chosen once): the
  // call's device is the current one, no query (cudaGetDevice on CUDA).
  bool single_device = false;
  // The native views (view, as_strided) are ATen's own functions, shared by
  // the CPU and CUDA backends: called directly, not redispatched.
  bool direct_views = false;
  c10::DeviceType native_type = c10::DeviceType::CPU;
  DeviceRuntime* runtime = nullptr;
  c10::Allocator* allocator = nullptr; // the runtime's, given to relabelled results
  c10::DispatchKeySet native_keys; // the native kernels' dispatch key
  // The keys of a native kernel's fresh result, outside and inside inference
  // mode, and the same keys relabelled as flagos's (anything else takes
  // TensorImpl::_change_backend_component_keys).
  c10::DispatchKeySet native_result_keys[2];
  c10::DispatchKeySet flagos_result_keys[2];

  // Where flagos device `index`'s memory is addressed natively.
  c10::Device nativeDevice(c10::DeviceIndex index) const {
    return DeviceRuntime::nativeDeviceOf(native_type, index);
  }
};

extern CallConstants g_call_constants;
// Makes flagos device `d` current through `guard` for a core kernel, unless
// it already is; with one device it always is, so nothing is queried
// (cudaGetDevice on CUDA).
inline void makeCurrent(const CallConstants& c, c10::OptionalDeviceGuard& guard, c10::Device d) {
  if (!c.single_device && c.runtime->getDevice() != d) {
    guard.reset_device(d);
  }
}

// Fills g_call_constants from the active runtime (raises if there is none).
const CallConstants& initCallConstants();

inline const CallConstants& callConstants() {
  if (C10_LIKELY(g_call_constants.ready.load(std::memory_order_acquire))) {
    return g_call_constants;
  }
  return initCallConstants();
}

} // namespace flagos::detail
