// The events of torch.autograd.profiler's own device timing for `flagos`
// (`profile(use_device="flagos")` without kineto, what `use_cuda=True`
// becomes in ported code). PyTorch asks a PrivateUse1 backend for them
// through registered stubs; without any, every op's record failed ("PrivateUse1
// used in profiler but not enabled") and the table's device times were
// garbage. These record the active runtime's own events on the current
// stream through the device guard, so the times are the runtime's: CUDA
// events with the CUDA plugin, host timestamps on the host runtime.

#include <flagos/Runtime.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <memory>

namespace flagos {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

// One recorded event and the device it belongs to (elapsed time and
// destruction ask for it).
struct RecordedEvent {
  void* event = nullptr;
  c10::DeviceIndex index = 0;
};

struct FlagosProfilerEvents final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    const c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
    const c10::Device current = guard.getDevice();
    if (device != nullptr) {
      *device = current.index();
    }
    auto recorded = std::shared_ptr<RecordedEvent>(new RecordedEvent{nullptr, current.index()}, [](RecordedEvent* e) {
      if (e->event != nullptr) {
        c10::impl::VirtualGuardImpl(c10::DeviceType::PrivateUse1).destroyEvent(e->event, e->index);
      }
      delete e;
    });
    if (cpu_ns != nullptr) {
      *cpu_ns = c10::getTime();
    }
    // BACKEND_DEFAULT: an event that keeps time (CUDA's default flags).
    guard.record(&recorded->event, guard.getStream(current), current.index(), c10::EventFlag::BACKEND_DEFAULT);
    *event = std::static_pointer_cast<void>(recorded);
  }

  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    const auto* a = static_cast<const RecordedEvent*>(start->get());
    const auto* b = static_cast<const RecordedEvent*>(end->get());
    const c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
    // The profiler counts microseconds; the guard gives milliseconds.
    return static_cast<float>(guard.elapsedTime(a->event, b->event, a->index) * 1000.0);
  }

  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override {
    return hasActiveRuntime();
  }

  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex count = activeRuntime().deviceCount();
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      const c10::DeviceGuard on(c10::Device(c10::DeviceType::PrivateUse1, i));
      op(i);
    }
  }

  void synchronize() const override {
    const c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
    guard.synchronizeDevice(guard.getDevice().index());
  }
};

const bool kRegistered = [] {
  static FlagosProfilerEvents events;
  torch::profiler::impl::registerPrivateUse1Methods(&events);
  return true;
}();

} // namespace
} // namespace flagos
