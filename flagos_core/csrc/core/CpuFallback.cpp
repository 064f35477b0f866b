// cpu_fallback: copy flagos arguments to host, run the CPU kernel, copy the
// results back. Only where the routed provider has no kernel; every call is
// counted by the router's trace under this provider's name.

#include <flagos/Relabel.h>
#include <flagos/Router.h>

#include "core/RelabelCall.h"
#include "core/RouterInternal.h"

#include <ATen/ATen.h>
#include <ATen/core/enum_tag.h>

namespace flagos {

std::string detail::cpuFallbackRefusal(const c10::OperatorHandle& op) {
  for (const c10::Argument& r : op.schema().returns()) {
    if (r.alias_info() != nullptr && !r.alias_info()->isWrite()) {
      return "it returns a view of its input, and through a copy to the CPU and back the result would be a copy "
             "(writes to it would not reach the input)";
    }
  }
  const std::string& name = op.operator_name().name;
  if (op.hasTag(at::Tag::inplace_view) || name == "aten::resize_" || name == "aten::resize_as_" ||
      name == "aten::set_" || name == "aten::_resize_output_") {
    return "it changes its input's storage, size or strides in place, which it would do to a CPU copy";
  }
  return "";
}

namespace {

class CpuFallbackProvider final : public KernelProvider {
 public:
  CpuFallbackProvider() : KernelProvider("cpu_fallback") {}

  // A CPU kernel, and an op whose effect survives copying (see cpuFallbackRefusal).
  bool canServe(const c10::OperatorHandle& op) const override {
    return op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU) && detail::cpuFallbackRefusal(op).empty();
  }

  void call(const c10::OperatorHandle& op, c10::DispatchKeySet, Stack* stack, const OpSlotInfo& info) override {
    // The router's last resort: an overload no provider serves ends here.
    // Say so, rather than let PyTorch report a missing CPU kernel for tensors
    // the caller made on flagos.
    const std::string refusal = detail::cpuFallbackRefusal(op);
    TORCH_CHECK_NOT_IMPLEMENTED(
        refusal.empty(), "flagos: no provider serves ", op.operator_name(), " on the ", activeRuntime().name(),
        " runtime, and cpu_fallback cannot: ", refusal);
    TORCH_CHECK_NOT_IMPLEMENTED(
        op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU), "flagos: no provider has a kernel for ",
        op.operator_name(), " on the ",
        activeRuntime().name(), " runtime: its own provider has none, and neither has the CPU, where cpu_fallback "
        "would run it. PyTorch implements it for other devices only. `python -m flagos_core ops` counts such "
        "overloads; a plugin can serve them (docs/plugin-guide.md).");
    const auto& args = op.schema().arguments();
    const size_t first = stack->size() - args.size();
    std::optional<c10::Device> device;
    std::optional<std::pair<c10::Device, size_t>> foreign; // as the host provider's calls: one device per call
    std::vector<std::pair<at::Tensor, at::Tensor>> written; // (host copy, flagos original)

    auto toHost = [&](const at::Tensor& t, size_t i, bool in_list) -> at::Tensor {
      if (!t.defined()) {
        return t;
      }
      if (t.device().type() != c10::DeviceType::PrivateUse1) {
        if (!foreign && !detail::foreignTensorAllowed(op, i, t, in_list, info.exact_device)) {
          foreign.emplace(t.device(), i);
        }
        return t;
      }
      if (device && *device != t.device()) {
        detail::mixedDevices(*device, t.device(), op, i);
      }
      device = device ? device : t.device();
      const c10::Argument& arg = args[i];
      at::Tensor host = t.to(c10::Device(c10::DeviceType::CPU));
      if (arg.alias_info() && arg.alias_info()->isWrite()) {
        written.emplace_back(host, t);
      }
      return host;
    };

    for (size_t i = 0; i < args.size(); ++i) {
      c10::IValue& v = (*stack)[first + i];
      if (v.isTensor()) {
        v = toHost(v.toTensor(), i, false);
      } else if (v.isTensorList()) {
        c10::List<at::Tensor> host;
        for (const at::Tensor& t : v.toTensorList()) {
          host.push_back(toHost(t, i, true));
        }
        v = std::move(host);
      } else if (v.isOptionalTensorList()) {
        c10::List<std::optional<at::Tensor>> host;
        for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
          host.push_back(t ? std::optional<at::Tensor>(toHost(*t, i, true)) : std::nullopt);
        }
        v = std::move(host);
      } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
        device = device ? device : v.toDevice();
        v = c10::Device(c10::DeviceType::CPU);
      } else if (v.isGenerator() && activeRuntime().nativeDeviceType() == c10::DeviceType::CPU) {
        v = activeRuntime().nativeGenerator(v.toGenerator());
      }
    }
    if (foreign && device) {
      detail::mixedDevices(*device, foreign->first, op, foreign->second);
    }
    const c10::Device target = device ? *device : c10::Device(c10::DeviceType::PrivateUse1, activeRuntime().getDevice().index());

    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

    // Results that are written arguments go back into the caller's tensors.
    const size_t returns = op.schema().returns().size();
    for (auto& [host, original] : written) {
      if (host.sizes() != original.sizes()) {
        original.resize_(host.sizes());
      }
      original.copy_(host);
    }
    for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
      c10::IValue& v = (*stack)[i];
      if (v.isTensor()) {
        v = back(v.toTensor(), written, target);
      } else if (v.isTensorList()) {
        c10::List<at::Tensor> out;
        for (const at::Tensor& t : v.toTensorList()) {
          out.push_back(back(t, written, target));
        }
        v = std::move(out);
      }
    }
  }

 private:
  static at::Tensor back(
      const at::Tensor& host,
      const std::vector<std::pair<at::Tensor, at::Tensor>>& written,
      const c10::Device& target) {
    if (!host.defined()) {
      return host;
    }
    for (const auto& [copy, original] : written) {
      if (copy.unsafeGetTensorImpl() == host.unsafeGetTensorImpl()) {
        return original;
      }
    }
    return host.to(target);
  }
};

} // namespace

void registerCpuFallbackProvider() {
  registerProvider(std::make_shared<CpuFallbackProvider>());
}

} // namespace flagos
