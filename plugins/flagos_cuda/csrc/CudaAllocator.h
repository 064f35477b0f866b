#pragma once

#include <c10/core/CachingDeviceAllocator.h>

namespace flagos::cuda {

// flagos memory is CUDA's caching allocator: one pool with native CUDA, and
// its statistics are the GPU's real footprint. Only the label differs.
class CudaAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  bool initialized() override;
  void emptyCache(c10::MempoolId_t pool = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override;
  void resetAccumulatedStats(c10::DeviceIndex index) override;
  void resetPeakStats(c10::DeviceIndex index) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override;
};

} // namespace flagos::cuda
