// Kernels the core serves itself for every runtime: allocation (so every
// flagos tensor comes from the active runtime's allocator), copies between
// flagos and other devices, and record_stream.

#include <flagos/Relabel.h>
#include <flagos/Runtime.h>

#include "core/Alias.h"
#include "core/CallConstants.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ATen.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/is_set_to_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace flagos {
namespace {

c10::DeviceIndex targetIndex(const detail::CallConstants& c, std::optional<c10::Device> device) {
  if (device && device->has_index()) {
    c.runtime->checkIndex(device->index());
    return device->index();
  }
  // With one device it is the current one: no query (cudaGetDevice on CUDA).
  return c.single_device ? 0 : c.runtime->getDevice().index();
}

const c10::DispatchKeySet kFlagosKeys(c10::DispatchKey::PrivateUse1);

// As the native devices' empty kernels do: with deterministic algorithms on
// (and torch.utils.deterministic.fill_uninitialized_memory, the default), new
// memory reads NaN (the largest value for integers), so a read of memory
// never written shows the same values as on the native device.
at::Tensor filledIfDeterministic(at::Tensor t) {
  const at::Context& context = at::globalContext();
  if (C10_UNLIKELY(context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory())) {
    at::native::fill_empty_deterministic_(t);
  }
  return t;
}

// Device memory is never pinned: CUDA's factories refuse the flag so, and
// flagos's ignored it.
void checkNotPinned(std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
}

at::Tensor empty(
    c10::IntArrayRef size,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  checkNotPinned(pin_memory);
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, "flagos: only strided tensors are supported, got ", *layout);
  const detail::CallConstants& c = detail::callConstants();
  const c10::DeviceIndex index = targetIndex(c, device);
  c10::OptionalDeviceGuard guard;
  detail::makeCurrent(c, guard, c10::Device(c10::DeviceType::PrivateUse1, index));
  at::Tensor t = at::detail::empty_generic(
      size, c.allocator, kFlagosKeys, c10::dtype_or_default(dtype), memory_format);
  return filledIfDeterministic(std::move(t));
}

at::Tensor emptyStrided(
    c10::IntArrayRef size,
    c10::IntArrayRef stride,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  checkNotPinned(pin_memory);
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, "flagos: only strided tensors are supported, got ", *layout);
  const detail::CallConstants& c = detail::callConstants();
  const c10::DeviceIndex index = targetIndex(c, device);
  c10::OptionalDeviceGuard guard;
  detail::makeCurrent(c, guard, c10::Device(c10::DeviceType::PrivateUse1, index));
  at::Tensor t = at::detail::empty_strided_generic(
      size, stride, c.allocator, kFlagosKeys, c10::dtype_or_default(dtype));
  return filledIfDeterministic(std::move(t));
}

bool shareOneStorage(const at::Tensor& a, const at::Tensor& b) {
  return a.device().type() == c10::DeviceType::PrivateUse1 && b.device().type() == c10::DeviceType::PrivateUse1 &&
      a.has_storage() && b.has_storage() && a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

// The native copy_ from `src` into `dst`, flagos tensors over one storage:
// their aliases share one native storage too, so copy_'s overlap check sees
// what it sees natively (pooled aliases each have their own).
void copyWithinOneStorage(const detail::CallConstants& c, const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  at::Tensor dst_native = nativeAliasOf(dst);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(dst_native.storage()), detail::keysFor(dst_native.device()), src.dtype());
  detail::copyGeometry(*src.unsafeGetTensorImpl(), *impl);
  at::_ops::copy_::redispatch(c.native_keys, dst_native, at::Tensor(std::move(impl)), non_blocking);
}

// Copies run as the native device's copy_ on aliases: memcpy for host,
// cudaMemcpyAsync for CUDA, with dtype/layout conversion included.
at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const at::Tensor& flagos_side = dst.device().type() == c10::DeviceType::PrivateUse1 ? dst : self;
  c10::DeviceGuard guard(flagos_side.device());
  if (C10_UNLIKELY(shareOneStorage(dst, self))) {
    copyWithinOneStorage(detail::callConstants(), dst, self, non_blocking);
    return dst;
  }
  at::Tensor dst_native = nativeAliasOf(dst);
  dst_native.copy_(nativeAliasOf(self), non_blocking);
  return dst;
}

// copy_ itself, so that a copy is one dispatch, as on the native device:
// PyTorch's generic copy_ would take flagos through _copy_from. The native
// copy_ on pooled aliases handles every pairing (flagos with flagos, the
// native device, or CPU) and dtype conversion.
at::Tensor& copyInPlace(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  const detail::CallConstants& c = detail::callConstants();
  const c10::Device device = self.device().type() == c10::DeviceType::PrivateUse1 ? self.device() : src.device();
  c10::OptionalDeviceGuard guard;
  detail::makeCurrent(c, guard, device);
  if (C10_UNLIKELY(shareOneStorage(self, src))) {
    copyWithinOneStorage(c, self, src, non_blocking);
    return self;
  }
  const ScopedNativeAlias dst(self);
  const ScopedNativeAlias from(src);
  at::_ops::copy_::redispatch(c.native_keys, const_cast<at::Tensor&>(dst.get()), from.get(), non_blocking);
  return self;
}

at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return copyFrom(self, dst, false);
}

// record_stream on the flagos tensor's own allocation: the runtime's
// allocator keeps it from reuse until the stream's pending work is done.
// Relabelled, the native record_stream would get an alias whose memory the
// native allocator does not know as its own, and CUDA's skips such memory
// without a word.
void recordStream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(
      stream.device_type() == c10::DeviceType::PrivateUse1, "flagos: record_stream on a flagos tensor needs a flagos ",
      "stream (torch.flagos.Stream, torch.flagos.current_stream()), got ", stream);
  if (!self.has_storage()) {
    return;
  }
  detail::callConstants().runtime->recordDataPtrOnStream(detail::allocationOf(self.storage()), stream);
}

} // namespace
} // namespace flagos

// Copies of conjugate / negative views: the native copy_ resolves the bits
// (the aliases carry them), so these keys pass straight through, as they do
// for copy_ itself. Materialising them first would copy, which recurses.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(flagos::empty));
  m.impl("empty_strided", TORCH_FN(flagos::emptyStrided));
  m.impl("copy_", TORCH_FN(flagos::copyInPlace));
  m.impl("_copy_from", TORCH_FN(flagos::copyFrom));
  m.impl("_copy_from_and_resize", TORCH_FN(flagos::copyFromAndResize));
  m.impl("record_stream", TORCH_FN(flagos::recordStream));
  // Compares storages, offsets and geometry, on any device: run on the
  // flagos tensors themselves, whose storages are the ones to compare (their
  // aliases in a call each have their own).
  m.impl("is_set_to", TORCH_FN(at::native::is_set_to));
}
