// The host (pinned-memory) allocator torch finds for `flagos` through
// at::getHostAllocator: torch.accelerator.empty_host_cache and the host
// memory statistics ask it, and without one they dereference nothing.
// Memory comes from the active runtime's pinned allocator. The cache and the
// statistics are those of the native device's host allocator where it has
// one (CUDA's caching host allocator, the same memory the CUDA plugin's
// pinned allocator hands out); otherwise nothing is cached or counted.

#include <flagos/Runtime.h>

#include <ATen/core/CachingHostAllocator.h>

namespace flagos {
namespace {

struct ForwardingHostAllocator final : public at::HostAllocator {
  at::HostAllocator* native() const {
    at::HostAllocator* a = at::getHostAllocator(activeRuntime().nativeDeviceType());
    return a == this ? nullptr : a;
  }
  static c10::Allocator& pinned() {
    return *activeRuntime().pinnedAllocator();
  }

  c10::DataPtr allocate(size_t n) override {
    return pinned().allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return pinned().raw_deleter();
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    pinned().copy_data(dest, src, count);
  }
  // False where the native device keeps no record: the runtime's pinned
  // memory is then not reused behind a pending copy's back, so there is
  // nothing to track.
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    at::HostAllocator* a = native();
    if (a == nullptr) {
      return false;
    }
    if (stream.device_type() == c10::DeviceType::PrivateUse1) { // flagos streams are the native ones, relabelled
      stream = c10::Stream(c10::Stream::UNSAFE, activeRuntime().nativeDevice(stream.device_index()), stream.id());
    }
    return a->record_event(ptr, ctx, stream);
  }
  void empty_cache() override {
    if (at::HostAllocator* a = native()) {
      a->empty_cache();
    }
  }
  at::HostStats get_stats() override {
    at::HostAllocator* a = native();
    return a != nullptr ? a->get_stats() : at::HostStats();
  }
  void reset_accumulated_stats() override {
    if (at::HostAllocator* a = native()) {
      a->reset_accumulated_stats();
    }
  }
  void reset_peak_stats() override {
    if (at::HostAllocator* a = native()) {
      a->reset_peak_stats();
    }
  }
};

ForwardingHostAllocator g_host_allocator;

struct Registrar {
  Registrar() {
    at::setHostAllocator(c10::DeviceType::PrivateUse1, &g_host_allocator);
  }
} g_registrar;

} // namespace
} // namespace flagos
