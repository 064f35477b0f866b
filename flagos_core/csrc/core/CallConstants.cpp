#include "core/CallConstants.h"

#include <c10/core/InferenceMode.h>
#include <c10/core/TensorImpl.h>

#include <mutex>

namespace flagos::detail {

CallConstants g_call_constants;

namespace {

// The key set of a fresh native tensor (as a kernel's result has it), and
// that set relabelled as flagos's.
std::pair<c10::DispatchKeySet, c10::DispatchKeySet> resultKeys(c10::DispatchKey native_key, c10::Device native) {
  auto probe = c10::make_intrusive<c10::TensorImpl>(
      c10::DispatchKeySet(native_key), caffe2::TypeMeta::Make<float>(), native);
  const c10::DispatchKeySet before = probe->key_set();
  probe->_change_backend_component_keys(c10::Device(c10::DeviceType::PrivateUse1, 0));
  return {before, probe->key_set()};
}

} // namespace

const CallConstants& initCallConstants() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  CallConstants& c = g_call_constants;
  if (c.ready.load(std::memory_order_acquire)) {
    return c;
  }
  DeviceRuntime& rt = activeRuntime();
  c.runtime = &rt;
  c.allocator = rt.allocator();
  c.native_type = rt.nativeDeviceType();
  c.single_device = rt.deviceCount() == 1;
  const c10::DispatchKey key = rt.nativeDispatchKey();
  c.native_keys = c10::DispatchKeySet(key);
  c.direct_views = key == c10::DispatchKey::CPU || key == c10::DispatchKey::CUDA;
  const c10::Device native = c.nativeDevice(0);
  std::tie(c.native_result_keys[0], c.flagos_result_keys[0]) = resultKeys(key, native);
  {
    c10::InferenceMode inference;
    std::tie(c.native_result_keys[1], c.flagos_result_keys[1]) = resultKeys(key, native);
  }
  c.ready.store(true, std::memory_order_release);
  return c;
}

} // namespace flagos::detail
