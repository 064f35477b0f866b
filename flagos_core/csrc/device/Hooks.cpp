// PrivateUse1 hooks (generators, pinned memory, storage resize) and the
// allocator PyTorch sees for `flagos`: both forward to the active runtime.

#include "core/Alias.h"

#include <flagos/Runtime.h>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>

#include <cstring>

namespace flagos {
namespace {

struct FlagosHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return hasActiveRuntime() && activeRuntime().deviceCount() > 0;
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    DeviceRuntime& rt = activeRuntime();
    const c10::DeviceIndex i = index < 0 ? rt.getDevice().index() : index;
    rt.checkIndex(i);
    return rt.defaultGenerator(i);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    DeviceRuntime& rt = activeRuntime();
    const c10::DeviceIndex i = index < 0 ? rt.getDevice().index() : index;
    rt.checkIndex(i);
    return rt.newGenerator(i);
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return activeRuntime().getDevice();
  }
  bool isPinnedPtr(const void* data) const override {
    return hasActiveRuntime() && activeRuntime().isPinnedPtr(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return activeRuntime().pinnedAllocator();
  }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return hasActiveRuntime() ? activeRuntime().deviceCount() : 0;
  }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    activeRuntime().setDevice(c10::Device(c10::DeviceType::PrivateUse1, index));
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return activeRuntime().getDevice().index();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    return activeRuntime().exchangeDevice(c10::Device(c10::DeviceType::PrivateUse1, index)).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  // UntypedStorage.resize_ on a flagos storage.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "flagos: this storage is not resizable");
    TORCH_CHECK(!detail::wrappedStorage(storage).has_value(),
                "flagos: this storage is a native tensor's memory (from_native); resize the flagos tensor, or ",
                "the native tensor's storage, instead");
    DeviceRuntime& rt = activeRuntime();
    c10::DeviceGuard guard(impl->device());
    c10::DataPtr fresh = rt.allocator()->allocate(new_bytes);
    const size_t keep = std::min(new_bytes, impl->nbytes());
    if (keep > 0) {
      rt.allocator()->copy_data(fresh.get(), impl->data_ptr().get(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(new_bytes);
    detail::followExports(impl);
  }
};

// What c10::GetAllocator(PrivateUse1) returns: the active runtime's allocator.
struct ForwardingAllocator final : public c10::DeviceAllocator {
  static c10::DeviceAllocator& target() {
    return *activeRuntime().allocator();
  }
  c10::DataPtr allocate(size_t n) override {
    return target().allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return target().raw_deleter();
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    target().copy_data(dest, src, count);
  }
  bool initialized() override {
    return hasActiveRuntime();
  }
  void emptyCache(c10::MempoolId_t pool) override {
    target().emptyCache(pool);
  }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    target().recordStream(ptr, stream);
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    return target().getDeviceStats(index);
  }
  void resetAccumulatedStats(c10::DeviceIndex index) override {
    target().resetAccumulatedStats(index);
  }
  void resetPeakStats(c10::DeviceIndex index) override {
    target().resetPeakStats(index);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    if (index >= 0) { // torch.accelerator.get_memory_info(i) comes here unchecked
      activeRuntime().checkIndex(index);
    }
    return target().getMemoryInfo(index);
  }
};

ForwardingAllocator g_allocator;

struct Registrar {
  Registrar() {
    static FlagosHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_allocator);
  }
} g_registrar;

} // namespace
} // namespace flagos
