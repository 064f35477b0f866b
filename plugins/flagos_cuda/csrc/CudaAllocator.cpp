#include "CudaAllocator.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

namespace flagos::cuda {
namespace {
c10::cuda::CUDACachingAllocator::CUDAAllocator& native() {
  return *c10::cuda::CUDACachingAllocator::get();
}
} // namespace

c10::DataPtr CudaAllocator::allocate(size_t nbytes) {
  c10::DataPtr ptr = native().allocate(nbytes);
  ptr.unsafe_set_device(c10::Device(c10::DeviceType::PrivateUse1, ptr.device().index()));
  return ptr;
}

c10::DeleterFnPtr CudaAllocator::raw_deleter() const {
  return native().raw_deleter();
}

void CudaAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  native().copy_data(dest, src, count);
}

bool CudaAllocator::initialized() {
  return native().initialized();
}

void CudaAllocator::emptyCache(c10::MempoolId_t pool) {
  native().emptyCache(pool);
}

void CudaAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  native().recordStream(ptr, c10::cuda::CUDAStream::unpack3(stream.id(), stream.device_index(), c10::DeviceType::CUDA));
}

c10::CachingDeviceAllocator::DeviceStats CudaAllocator::getDeviceStats(c10::DeviceIndex index) {
  return native().getDeviceStats(index);
}

void CudaAllocator::resetAccumulatedStats(c10::DeviceIndex index) {
  native().resetAccumulatedStats(index);
}

void CudaAllocator::resetPeakStats(c10::DeviceIndex index) {
  native().resetPeakStats(index);
}

std::pair<size_t, size_t> CudaAllocator::getMemoryInfo(c10::DeviceIndex index) {
  return native().getMemoryInfo(index);
}

} // namespace flagos::cuda
