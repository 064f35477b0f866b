// PyTorch's device guard for `flagos`: forwards to the active runtime, so a
// plugin's runtime takes over device selection, streams and events.

#include <flagos/Runtime.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace flagos {
namespace {

struct ForwardingGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static DeviceRuntime& rt() {
    return activeRuntime();
  }
  c10::DeviceType type() const override {
    return c10::DeviceType::PrivateUse1;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    return rt().exchangeDevice(d);
  }
  c10::Device getDevice() const override {
    return rt().getDevice();
  }
  void setDevice(c10::Device d) const override {
    rt().setDevice(d);
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    rt().uncheckedSetDevice(d);
  }
  c10::Stream getStream(c10::Device d) const override {
    return rt().getStream(d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return rt().getDefaultStream(d);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return rt().getStreamFromGlobalPool(d, high_priority);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return rt().getNewStream(d, priority);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return rt().exchangeStream(s);
  }
  void destroyEvent(void* event, const c10::DeviceIndex index) const noexcept override {
    rt().destroyEvent(event, index);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex index, const c10::EventFlag flag)
      const override {
    rt().record(event, stream, index, flag);
  }
  void block(void* event, const c10::Stream& stream) const override {
    rt().block(event, stream);
  }
  bool queryEvent(void* event) const override {
    return rt().queryEvent(event);
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return hasActiveRuntime() ? rt().deviceCount() : 0;
  }
  bool queryStream(const c10::Stream& stream) const override {
    return rt().queryStream(stream);
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    rt().synchronizeStream(stream);
  }
  void synchronizeEvent(void* event) const override {
    rt().synchronizeEvent(event);
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    // torch.accelerator.synchronize(i) comes here unchecked: a device that
    // does not exist is an error, as for the other device calls.
    if (index >= 0) {
      rt().checkIndex(index);
    }
    rt().synchronizeDevice(index);
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    rt().recordDataPtrOnStream(data_ptr, stream);
  }
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    return rt().getDeviceCapability(d);
  }
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 11
  void* getStreamNativeHandle(const c10::Stream stream) const override {
    return rt().getStreamNativeHandle(stream);
  }
#endif
  double elapsedTime(void* start, void* end, const c10::DeviceIndex index) const override {
    return rt().elapsedTime(start, end, index);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, ForwardingGuardImpl);

} // namespace
} // namespace flagos
