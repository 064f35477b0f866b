// example_cpp: a kernel provider written in C++, serving add.Tensor and
// mul.Tensor.
//
// The router hands a provider boxed calls: the operator and a stack holding
// its arguments (flagos tensors, scalars, ...). The provider pops the
// arguments, computes, and pushes the results. This one runs the active
// runtime's native ATen kernels (CPU on the host runtime, CUDA on
// flagos-cuda) on aliases of the flagos tensors, without copying data:
//
//   toNative(t, device)       a native-device tensor over a flagos tensor's memory
//   ScopedNativeAlias a(t)    the same for one scope, from a per-thread pool
//   adoptNative(t, index)     a flagos tensor over a native tensor's memory
//   adoptNative(std::move(t), index)  the same, taking over a fresh result
//
// add.Tensor uses the first and third, mul.Tensor the allocation-free pair.
//
// A real plugin would call its own library here instead of at::add.

#include "ExampleProvider.h"

#include <flagos/Relabel.h>
#include <flagos/Router.h>
#include <flagos/Runtime.h>

#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <c10/core/DeviceGuard.h>

#include <memory>

namespace flagos::example {
namespace {

enum class Op { kAdd, kMul, kNone };

Op which(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  if (name.overload_name == "Tensor") {
    if (name.name == "aten::add") {
      return Op::kAdd;
    }
    if (name.name == "aten::mul") {
      return Op::kMul;
    }
  }
  return Op::kNone;
}

// The flagos device a binary op runs on. Like PyTorch's own backends, a
// 0-dim CPU tensor (how Python numbers arrive: `x * 2`) may join a device
// tensor; any other mix of devices is an error.
c10::Device deviceOf(const at::Tensor& a, const at::Tensor& b, const c10::OperatorHandle& op) {
  const bool a_flagos = a.device().type() == c10::DeviceType::PrivateUse1;
  const bool b_flagos = b.device().type() == c10::DeviceType::PrivateUse1;
  const auto scalar = [](const at::Tensor& t) { return t.dim() == 0 && t.device().is_cpu(); };
  const bool same = a_flagos && b_flagos ? a.device() == b.device() : (a_flagos ? scalar(b) : scalar(a));
  TORCH_CHECK(
      same, "Expected all tensors to be on the same device, but found at least two devices, ", a.device(), " and ",
      b.device(), "! (in ", op.operator_name(), ", served by flagos-example's example_cpp)");
  return a_flagos ? a.device() : b.device();
}

// The tensor a native kernel can take: an alias of a flagos tensor, or the
// CPU scalar as it is.
at::Tensor native(const at::Tensor& t) {
  if (t.device().type() != c10::DeviceType::PrivateUse1) {
    return t;
  }
  return toNative(t, activeRuntime().nativeDevice(t.device().index()));
}

class ExampleProvider final : public KernelProvider {
 public:
  ExampleProvider() : KernelProvider("example_cpp") {}

  // Asked once per overload, when the overload is routed here or first called.
  bool canServe(const c10::OperatorHandle& op) const override {
    return which(op) != Op::kNone;
  }

  void call(const c10::OperatorHandle& op, c10::DispatchKeySet, Stack* stack, const OpSlotInfo&) override {
    switch (which(op)) {
      case Op::kAdd: {
        // add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
        auto args = torch::jit::pop(*stack, 3);
        const at::Tensor self = args[0].toTensor();
        const at::Tensor other = args[1].toTensor();
        const c10::Device device = deviceOf(self, other, op);
        c10::DeviceGuard guard(device);
        const at::Tensor out = at::add(native(self), native(other), args[2].toScalar());
        torch::jit::push(*stack, adoptNative(out, device.index()));
        return;
      }
      case Op::kMul: {
        // mul.Tensor(Tensor self, Tensor other) -> Tensor
        auto args = torch::jit::pop(*stack, 2);
        const at::Tensor self = args[0].toTensor();
        const at::Tensor other = args[1].toTensor();
        const c10::Device device = deviceOf(self, other, op);
        c10::DeviceGuard guard(device);
        const ScopedNativeAlias a(self), b(other); // self and other outlive them
        at::Tensor out = at::mul(a.get(), b.get());
        torch::jit::push(*stack, adoptNative(std::move(out), device.index()));
        return;
      }
      case Op::kNone:
        break;
    }
    TORCH_CHECK(false, "flagos-example: example_cpp has no kernel for ", op.operator_name());
  }
};

} // namespace

void registerExampleProvider() {
  registerProvider(std::make_shared<ExampleProvider>());
}

} // namespace flagos::example
