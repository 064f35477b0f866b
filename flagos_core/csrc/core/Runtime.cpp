#include <flagos/Runtime.h>

#include <atomic>
#include <mutex>

namespace flagos {
namespace {

std::mutex g_mutex;
std::shared_ptr<DeviceRuntime> g_runtime;
// Raw pointer for the per-call path: set once, read without a lock.
std::atomic<DeviceRuntime*> g_active{nullptr};

} // namespace

void DeviceRuntime::checkIndex(c10::DeviceIndex index) const {
  const auto count = deviceCount();
  TORCH_CHECK(
      index >= 0 && index < count,
      "flagos:", static_cast<int>(index), " is not a valid device: the ", name(),
      " runtime has ", static_cast<int>(count), " flagos device(s), flagos:0 to flagos:",
      static_cast<int>(count) - 1);
}

c10::DeviceCapability DeviceRuntime::getDeviceCapability(c10::Device d) const {
  const c10::DeviceIndex index = d.has_index() ? d.index() : getDevice().index();
  checkIndex(index);
  return c10::impl::getDeviceGuardImpl(nativeDeviceType())->getDeviceCapability(nativeDevice(index));
}

#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 11
void* DeviceRuntime::getStreamNativeHandle(const c10::Stream stream) const {
  checkIndex(stream.device_index());
  return c10::impl::getDeviceGuardImpl(nativeDeviceType())
      ->getStreamNativeHandle(c10::Stream(c10::Stream::UNSAFE, nativeDevice(stream.device_index()), stream.id()));
}
#endif

DeviceRuntime& activeRuntime() {
  DeviceRuntime* rt = g_active.load(std::memory_order_acquire);
  TORCH_CHECK(
      rt != nullptr,
      "flagos: no device runtime is active; import flagos_core (or torch, which autoloads it) first");
  return *rt;
}

bool hasActiveRuntime() {
  return g_active.load(std::memory_order_acquire) != nullptr;
}

void activateRuntime(std::shared_ptr<DeviceRuntime> runtime) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(runtime != nullptr, "flagos: activateRuntime needs a runtime");
  TORCH_CHECK(
      g_runtime == nullptr || g_runtime->name() == runtime->name(),
      "flagos: the ", g_runtime ? g_runtime->name() : "", " runtime is already active; a process has one runtime, chosen before its first flagos operation");
  if (g_runtime) {
    return;
  }
  g_runtime = std::move(runtime);
  g_active.store(g_runtime.get(), std::memory_order_release);
}

} // namespace flagos
