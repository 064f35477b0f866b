// The built-in host runtime: flagos devices backed by host RAM, CPU kernels
// through the `host` provider. The default where no accelerator plugin is
// active, and what CI runs on.

#include "host/HostAllocator.h"
#include "host/HostRuntime.h"

#include <flagos/Generator.h>
#include <flagos/Relabel.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <flagos/Router.h>

#include <c10/core/AutogradState.h>
#include <c10/core/CPUAllocator.h>

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <vector>

namespace flagos::host {
namespace {

thread_local c10::DeviceIndex t_current_device = 0;
// Device whose memory CPU allocations go to while a host kernel runs; -1: none.
thread_local c10::DeviceIndex t_redirect_device = -1;
// Current stream id per device, per thread (0: the default stream). A
// fixed array: the autograd engine reads and swaps streams around every
// backward node, and a plain array needs no thread-local initialisation
// check per access.
constexpr size_t kMaxDevices = static_cast<size_t>(std::numeric_limits<c10::DeviceIndex>::max()) + 1;
thread_local std::array<c10::StreamId, kMaxDevices> t_streams{};

struct HostEvent {
  std::chrono::steady_clock::time_point when;
  bool recorded = false;
};

// CPU kernels allocate outputs with the CPU allocator; while a host kernel
// runs, this sends those allocations to the flagos device's pool so that
// device memory statistics see them. Elsewhere it is the CPU allocator.
class RedirectingCpuAllocator final : public c10::Allocator {
 public:
  RedirectingCpuAllocator(c10::Allocator* base, HostCachingAllocator* pool) : base_(base), pool_(pool) {
    instance_ = this;
  }
  RedirectingCpuAllocator(const RedirectingCpuAllocator&) = delete;
  c10::DataPtr allocate(size_t n) override {
    if (t_redirect_device >= 0) {
      return pool_->allocateOn(n, t_redirect_device, c10::Device(c10::DeviceType::CPU));
    }
    return base_->allocate(n);
  }
  // raw_allocate'd memory (oneDNN scratch) may come from either side.
  c10::DeleterFnPtr raw_deleter() const override {
    return base_->raw_deleter() != nullptr ? &rawDelete : nullptr;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  static void rawDelete(void* data) {
    if (!instance_->pool_->releaseByData(data)) {
      instance_->base_->raw_deleter()(data);
    }
  }
  static inline RedirectingCpuAllocator* instance_ = nullptr;
  c10::Allocator* base_;
  HostCachingAllocator* pool_;
};

class HostRuntime final : public DeviceRuntime {
 public:
  explicit HostRuntime(c10::DeviceIndex devices)
      : devices_(devices), allocator_(devices, [] { return t_current_device; }), next_stream_(devices) {
    for (c10::DeviceIndex i = 0; i < devices; ++i) {
      // flagos:0 draws from CPU's own default generator, as the CPU kernels
      // it runs do when a call passes none (dropout): one stream, so a
      // script gives the numbers it gives on CPU, and saving or seeding the
      // device's state covers every draw. Further host devices, which only
      // stand in for several accelerators, have generators of their own.
      generators_.push_back(
          i == 0 ? at::make_generator<NativeBackedGenerator>(i, at::detail::getDefaultCPUGenerator()) : newGenerator(i));
      next_stream_[i].store(1);
    }
  }

  std::string name() const override {
    return "host";
  }
  c10::DeviceType nativeDeviceType() const override {
    return c10::DeviceType::CPU;
  }
  c10::DispatchKey nativeDispatchKey() const override {
    return c10::DispatchKey::CPU;
  }
  c10::DeviceAllocator* allocator() override {
    return &allocator_;
  }
  HostCachingAllocator& pool() {
    return allocator_;
  }
  c10::Allocator* pinnedAllocator() override {
    return &pinned_;
  }
  // On a torch built with CUDA and a GPU present, torch takes pinned memory
  // from CUDA's allocator whatever the accelerator (torch 2.11 does), so
  // that memory counts as pinned too.
  bool isPinnedPtr(const void* ptr) override {
    return pinned_.isPinned(ptr) || (at::globalContext().hasCUDA() && at::detail::getCUDAHooks().isPinnedPtr(ptr));
  }
  const at::Generator& defaultGenerator(c10::DeviceIndex index) override {
    checkIndex(index);
    return generators_[index];
  }
  at::Generator newGenerator(c10::DeviceIndex index) override {
    checkIndex(index);
    return at::make_generator<NativeBackedGenerator>(index, at::make_generator<at::CPUGeneratorImpl>());
  }
  at::Generator nativeGenerator(const at::Generator& gen) override {
    return NativeBackedGenerator::unwrap(gen);
  }
  DeviceProperties properties(c10::DeviceIndex index) override {
    checkIndex(index);
    DeviceProperties p;
    p.name = "flagos host device " + std::to_string(index);
    // Host RAM backs every host device.
    p.total_memory = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGE_SIZE));
    p.multi_processor_count = 1;
    return p;
  }

  // Device selection.
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    if (d.index() >= 0 && d.index() != old.index()) {
      setDevice(d);
    }
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::PrivateUse1, t_current_device);
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == c10::DeviceType::PrivateUse1, "flagos: not a flagos device: ", d);
    requireIndex(d.index());
    t_current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < devices_) {
      t_current_device = d.index();
    }
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return devices_;
  }

  // Streams. Host work runs synchronously in issue order, so every stream
  // is always complete; ids still distinguish streams.
  c10::Stream getStream(c10::Device d) const override {
    const c10::Device device = normalize(d);
    return c10::Stream(c10::Stream::UNSAFE, device, t_streams[device.index()]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, normalize(d));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    const c10::Device device = normalize(d);
    return c10::Stream(c10::Stream::UNSAFE, device, next_stream_[device.index()].fetch_add(1));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::Device device = normalize(s.device());
    c10::StreamId& slot = t_streams[device.index()];
    const c10::Stream old(c10::Stream::UNSAFE, device, slot);
    slot = s.id();
    return old;
  }
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}

  // Events record when the work before them finished (now, on host).
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index, const c10::EventFlag)
      const override {
    TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1, "flagos: event recorded on a non-flagos stream");
    // As CUDA's: an event keeps the device it was first recorded on.
    TORCH_CHECK(
        device_index == -1 || device_index == stream.device_index(), "Event device index ",
        static_cast<int>(device_index), " does not match recording stream's device index ",
        static_cast<int>(stream.device_index()), ".");
    if (*event == nullptr) {
      *event = new HostEvent();
    }
    auto* e = static_cast<HostEvent*>(*event);
    e->when = std::chrono::steady_clock::now();
    e->recorded = true;
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    return true;
  }
  void synchronizeEvent(void*) const override {}
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<HostEvent*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<HostEvent*>(start);
    auto* b = static_cast<HostEvent*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded, "flagos: both events must be recorded before elapsed_time");
    return std::chrono::duration<double, std::milli>(b->when - a->when).count();
  }

 private:
  c10::Device normalize(c10::Device d) const {
    const c10::DeviceIndex index = d.has_index() ? d.index() : t_current_device;
    requireIndex(index);
    return c10::Device(c10::DeviceType::PrivateUse1, index);
  }
  // checkIndex without its virtual device-count call on the valid path: the
  // autograd engine sets devices and swaps streams around every backward node.
  void requireIndex(c10::DeviceIndex index) const {
    if (C10_UNLIKELY(index < 0 || index >= devices_)) {
      checkIndex(index); // throws, naming the valid devices
    }
  }

  c10::DeviceIndex devices_;
  HostCachingAllocator allocator_;
  PinnedAllocator pinned_;
  std::vector<at::Generator> generators_;
  mutable std::vector<std::atomic<c10::StreamId>> next_stream_;
};

// PyTorch runs an accelerator's backward on an autograd worker thread. On
// the host runtime that thread runs CPU kernels, and every thread that
// enters an OpenMP parallel region gets a team of its own: the caller's team
// and the worker's oversubscribe the cores (a tiny-Qwen3 training step took
// 1.5 to 3x CPU's time on 2 cores, 2 torch threads). CPU's backward runs
// on the calling thread; so does the host runtime's: autograd multithreading
// is turned off once per thread, for the importing thread on activation and
// for any other at its first host kernel
// (torch.autograd.set_multithreading_enabled(True) turns it back on).
thread_local bool t_backward_on_caller = false;

void runBackwardOnCallingThread() {
  t_backward_on_caller = true;
  c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
}

// The `host` provider: CPU kernels on relabelled flagos tensors, with CPU
// allocations made during the kernel taken from the device's pool.
class HostProvider final : public RelabelProvider {
 public:
  HostProvider() : RelabelProvider("host") {}

  // CPU's histc has no integer kernels, CUDA's has, and model code written
  // for CUDA calls them: the core's composite provider serves histc instead
  // (floats through CPU's histc.out).
  bool canServe(const c10::OperatorHandle& op) const override {
    const auto& name = op.operator_name();
    if (name.name == "aten::histc" && name.overload_name.empty()) {
      return false;
    }
    return RelabelProvider::canServe(op);
  }

  int64_t enterNative(c10::DeviceIndex index) override {
    if (C10_UNLIKELY(!t_backward_on_caller)) {
      runBackwardOnCallingThread();
    }
    const c10::DeviceIndex saved = t_redirect_device;
    t_redirect_device = index;
    return saved;
  }
  void exitNative(int64_t entered) override {
    t_redirect_device = static_cast<c10::DeviceIndex>(entered);
  }
};

} // namespace

void activateHostRuntime(c10::DeviceIndex devices) {
  TORCH_CHECK(devices >= 1 && devices <= 64, "flagos: FLAGOS_HOST_DEVICES must be between 1 and 64, got ", static_cast<int>(devices));
  if (hasActiveRuntime()) { // a process has one runtime: activating it again changes nothing
    const std::string active = activeRuntime().name();
    TORCH_CHECK(active == "host", "flagos: the ", active, " runtime is already active; a process has one runtime");
    return;
  }
  auto runtime = std::make_shared<HostRuntime>(devices);
  static RedirectingCpuAllocator* redirect = nullptr;
  if (redirect == nullptr) {
    redirect = new RedirectingCpuAllocator(c10::GetCPUAllocator(), &runtime->pool());
    c10::SetCPUAllocator(redirect, /*priority=*/100);
  }
  activateRuntime(runtime);
  registerProvider(std::make_shared<HostProvider>());
  setDefaultProvider("host");
  // The importing thread from the start, so that a choice its code makes
  // after `import torch` stands; other threads at their first host kernel.
  runBackwardOnCallingThread();
}

} // namespace flagos::host
