// The CUDA runtime: flagos devices are CUDA devices. Device selection,
// streams and events are CUDA's own (PyTorch's CUDA guard, relabelled), so
// flagos streams are CUDA streams and interoperate with torch.cuda.

#include "CudaRuntime.h"

#include "CudaAllocator.h"

#include <flagos/Generator.h>
#include <flagos/Relabel.h>
#include <flagos/Router.h>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace flagos::cuda {
namespace {

c10::Device toCuda(c10::Device d) {
  return c10::Device(c10::DeviceType::CUDA, d.index());
}
c10::Device toFlagos(c10::Device d) {
  return c10::Device(c10::DeviceType::PrivateUse1, d.index());
}
c10::Stream toCuda(c10::Stream s) {
  return c10::Stream(c10::Stream::UNSAFE, toCuda(s.device()), s.id());
}
c10::Stream toFlagos(c10::Stream s) {
  return c10::Stream(c10::Stream::UNSAFE, toFlagos(s.device()), s.id());
}

class CudaRuntime final : public DeviceRuntime {
 public:
  CudaRuntime() {
    const c10::DeviceIndex count = cuda().deviceCount();
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      // flagos:i draws from cuda:i's default generator: the one CUDA's
      // kernels take when a call passes none (dropout, flash attention), and
      // the one CUDA graph capture registers. One stream per GPU, as natively.
      generators_.push_back(at::make_generator<NativeBackedGenerator>(i, at::cuda::detail::getDefaultCUDAGenerator(i)));
    }
  }

  std::string name() const override {
    return "cuda";
  }
  c10::DeviceType nativeDeviceType() const override {
    return c10::DeviceType::CUDA;
  }
  c10::DispatchKey nativeDispatchKey() const override {
    return c10::DispatchKey::CUDA;
  }
  c10::DeviceAllocator* allocator() override {
    return &allocator_;
  }
  c10::Allocator* pinnedAllocator() override {
    return at::detail::getCUDAHooks().getPinnedMemoryAllocator();
  }
  bool isPinnedPtr(const void* ptr) override {
    return at::detail::getCUDAHooks().isPinnedPtr(ptr);
  }
  const at::Generator& defaultGenerator(c10::DeviceIndex index) override {
    checkIndex(index);
    return generators_[index];
  }
  at::Generator newGenerator(c10::DeviceIndex index) override {
    checkIndex(index);
    return at::make_generator<NativeBackedGenerator>(index, at::make_generator<at::CUDAGeneratorImpl>(index));
  }
  at::Generator nativeGenerator(const at::Generator& gen) override {
    return NativeBackedGenerator::unwrap(gen);
  }
  DeviceProperties properties(c10::DeviceIndex index) override {
    checkIndex(index);
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(index);
    DeviceProperties out;
    out.name = p->name;
    out.total_memory = p->totalGlobalMem;
    out.major = p->major;
    out.minor = p->minor;
    out.multi_processor_count = p->multiProcessorCount;
    return out;
  }

  c10::Device exchangeDevice(c10::Device d) const override {
    return toFlagos(cuda().exchangeDevice(toCuda(d)));
  }
  c10::Device getDevice() const override {
    return toFlagos(cuda().getDevice());
  }
  void setDevice(c10::Device d) const override {
    checkIndex(d.index());
    cuda().setDevice(toCuda(d));
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    cuda().uncheckedSetDevice(toCuda(d));
  }
  c10::Stream getStream(c10::Device d) const override {
    return toFlagos(cuda().getStream(toCuda(d)));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return toFlagos(cuda().getDefaultStream(toCuda(d)));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return toFlagos(cuda().getStreamFromGlobalPool(toCuda(d), high_priority));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return toFlagos(cuda().getNewStream(toCuda(d), priority));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return toFlagos(cuda().exchangeStream(toCuda(s)));
  }
  void destroyEvent(void* event, const c10::DeviceIndex index) const noexcept override {
    cuda().destroyEvent(event, index);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex index, const c10::EventFlag flag)
      const override {
    cuda().record(event, toCuda(stream), index, flag);
  }
  void block(void* event, const c10::Stream& stream) const override {
    cuda().block(event, toCuda(stream));
  }
  bool queryEvent(void* event) const override {
    return cuda().queryEvent(event);
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return cuda().deviceCount();
  }
  bool queryStream(const c10::Stream& stream) const override {
    return cuda().queryStream(toCuda(stream));
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    cuda().synchronizeStream(toCuda(stream));
  }
  void synchronizeEvent(void* event) const override {
    cuda().synchronizeEvent(event);
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    cuda().synchronizeDevice(index);
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    cuda().recordDataPtrOnStream(data_ptr, toCuda(stream));
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex index) const override {
    return cuda().elapsedTime(start, end, index);
  }

 private:
  static const c10::impl::DeviceGuardImplInterface& cuda() {
    return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  }

  CudaAllocator allocator_;
  std::vector<at::Generator> generators_;
};

} // namespace

void activate() {
  activateRuntime(std::make_shared<CudaRuntime>());
  // The `cuda` provider: CUDA kernels on zero-copy CUDA aliases.
  registerProvider(std::make_shared<RelabelProvider>("cuda"));
  setDefaultProvider("cuda");
}

} // namespace flagos::cuda
