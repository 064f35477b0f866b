// Nested tensors on flagos (torch.nested's strided layout, and what
// nn.TransformerEncoder's inference fast path builds from a padding mask):
// the native device's nested kernels, run on native aliases.
//
// A flagos nested tensor is PyTorch's NestedTensorImpl over flagos memory
// (its key set NestedTensor + PrivateUse1), with its sizes, strides and
// offsets as CPU tensors. For each op on one, this fallback wraps the same
// memory and the same metadata as a native nested tensor (and dense flagos
// arguments as native aliases), runs the op natively, and wraps the native
// results' memory back as flagos tensors: no copy either way.

#include <flagos/Relabel.h>
#include <flagos/Runtime.h>

#include "core/CallConstants.h"
#include "core/StandIns.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <string>
#include <string_view>
#include <vector>

namespace flagos {
namespace {

// A nested tensor of the native device over `buffer`'s memory with `like`'s
// sizes, strides and offsets (or a flagos one, from a flagos buffer).
at::Tensor nestedOver(const at::Tensor& buffer, const at::native::NestedTensorImpl& like) {
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      buffer, like.get_nested_sizes(), like.get_nested_strides(), like.get_storage_offsets());
}

at::Tensor nativeStandIn(const at::Tensor& t) {
  if (!t.is_nested()) {
    return nativeAliasOf(t);
  }
  const at::native::NestedTensorImpl* nested = at::native::get_nested_tensor_impl(t);
  return nestedOver(nativeAliasOf(nested->get_unsafe_storage_as_tensor()), *nested);
}

class NestedCall {
 public:
  c10::IValue toNative(const c10::IValue& v) {
    if (v.isDevice()) {
      // A device argument (`_to_copy`'s) says where the results go, whatever
      // devices the tensors are on: moving a CPU nested tensor to flagos, or
      // a flagos one to the CPU, which on the host runtime is also the
      // native device.
      c10::Device d = v.toDevice();
      if (d.type() != c10::DeviceType::PrivateUse1) {
        requested_ = d;
        return v;
      }
      if (!d.has_index()) {
        d = c10::Device(c10::DeviceType::PrivateUse1, activeRuntime().getDevice().index());
      }
      requested_ = d;
      return detail::callConstants().nativeDevice(d.index());
    }
    return detail::mapTensors(v, [this](const at::Tensor& t) { return standIns_.toNative(t, nativeStandIn); });
  }

  // A result: a stand-in gives the caller's flagos tensor (in-place ops); any
  // other tensor of the native device is wrapped as flagos, no copy.
  c10::IValue fromNative(const c10::IValue& v, bool metadata) const {
    return detail::mapTensors(v, [&](const at::Tensor& t) { return fromNative(t, metadata); });
  }

  // The flagos device the call runs on: its tensors', else the one asked for.
  std::optional<c10::Device> device() const {
    if (auto d = standIns_.device()) {
      return d;
    }
    if (requested_ && requested_->type() == c10::DeviceType::PrivateUse1) {
      return requested_;
    }
    return std::nullopt;
  }

 private:
  at::Tensor fromNative(const at::Tensor& t, bool metadata) const {
    if (const at::Tensor* callers = standIns_.callersTensor(t)) {
      return *callers;
    }
    const auto device = requested_ ? requested_ : standIns_.device();
    if (!t.defined() || !device || device->type() != c10::DeviceType::PrivateUse1 || metadata ||
        t.device().type() != detail::callConstants().native_type) {
      return t;
    }
    if (!t.is_nested()) {
      return adoptNative(t, device->index());
    }
    const at::native::NestedTensorImpl* nested = at::native::get_nested_tensor_impl(t);
    return nestedOver(adoptNative(nested->get_unsafe_storage_as_tensor(), device->index()), *nested);
  }

  detail::StandIns standIns_;
  std::optional<c10::Device> requested_; // a device argument's
};

// Ops that give a nested tensor's own sizes, strides or offsets: CPU tensors
// natively on every device, so they stay CPU tensors here too.
bool givesMetadata(const c10::OperatorHandle& op) {
  const std::string_view name = op.schema().name();
  return name.rfind("aten::_nested_tensor_size", 0) == 0 || name.rfind("aten::_nested_tensor_strides", 0) == 0 ||
      name.rfind("aten::_nested_tensor_storage_offsets", 0) == 0 || name.rfind("aten::_nested_get_", 0) == 0;
}

void nestedKernel(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  const size_t count = op.schema().arguments().size();
  NestedCall call;
  for (size_t i = stack->size() - count; i < stack->size(); ++i) {
    (*stack)[i] = call.toNative((*stack)[i]);
  }
  c10::OptionalDeviceGuard guard;
  if (auto device = call.device()) {
    guard.reset_device(*device);
  }
  op.callBoxed(stack); // every tensor is the native device's now: its nested kernel
  const bool metadata = givesMetadata(op);
  const size_t returns = op.schema().returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    (*stack)[i] = call.fromNative((*stack)[i], metadata);
  }
}

bool hasNativeNestedKernel(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) ||
      op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCUDA);
}

// An op with nested kernels of its own (matmul, linear, ...) often has a
// CompositeImplicitAutograd decomposition too, which the dispatcher prefers
// to a fallback and which fails on a nested tensor's sizes: such ops get the
// kernel above by name. At load, after PyTorch's own registrations.
const bool kServedByName = [] {
  static auto* library = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::NestedTensorPrivateUse1, __FILE__, __LINE__);
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) {
      continue;
    }
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (op && hasNativeNestedKernel(*op) && !op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorPrivateUse1)) {
      std::string overload = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      library->impl(overload.c_str(), torch::CppFunction::makeFromBoxedFunction<&nestedKernel>());
    }
  }
  return true;
}();

} // namespace
} // namespace flagos

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&flagos::nestedKernel>());
}
