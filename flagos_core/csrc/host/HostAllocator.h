#pragma once

// Device memory of the host runtime: host RAM through a caching allocator
// with per-device statistics, plus the pinned-memory allocator.

#include <c10/core/CachingDeviceAllocator.h>

#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace flagos::host {

class HostCachingAllocator final : public c10::DeviceAllocator {
 public:
  // `current_device` tells which device a plain allocate() is for.
  HostCachingAllocator(c10::DeviceIndex devices, std::function<c10::DeviceIndex()> current_device);
  ~HostCachingAllocator() override;

  c10::DataPtr allocate(size_t nbytes) override;
  // Memory of flagos:<index>, labelled `label` (the CPU label while a CPU
  // kernel runs on it, relabelled flagos afterwards). The DataPtr's context
  // is its data pointer, as c10's raw_allocate demands of CPU allocations
  // (oneDNN scratch memory goes that way); raw_deallocate frees through
  // releaseByData.
  c10::DataPtr allocateOn(size_t nbytes, c10::DeviceIndex index, c10::Device label);
  // Frees a block of this pool by its data pointer; false if `data` is not one.
  bool releaseByData(void* data);

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr; // blocks carry a context; no raw pointers out
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t pool = {0, 0}) override;
  void recordStream(const c10::DataPtr&, c10::Stream) override {} // host work is synchronous
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override;
  void resetAccumulatedStats(c10::DeviceIndex index) override;
  void resetPeakStats(c10::DeviceIndex index) override;
  // (free, total) bytes: host RAM, which every host device draws on.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override;

  struct Block;
  struct Pool;

 private:
  // The runtime's error for a device index with no pool (torch.accelerator's
  // memory calls reach the allocator without the runtime's own check).
  void checkDevice(c10::DeviceIndex index) const {
    if (C10_UNLIKELY(index < 0 || static_cast<size_t>(index) >= pools_.size())) {
      invalidDevice(index);
    }
  }
  [[noreturn]] void invalidDevice(c10::DeviceIndex index) const;

  std::vector<std::unique_ptr<Pool>> pools_;
  std::function<c10::DeviceIndex()> current_device_;
};

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  bool isPinned(const void* ptr);

 private:
  friend void freePinned(void* ctx);
  std::mutex mutex_;
  std::unordered_set<const void*> live_;
};

} // namespace flagos::host
