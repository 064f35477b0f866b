// Kernel providers written in Python: a dict {overload: callable}. The
// callable gets the call's arguments as Python objects (flagos tensors) and
// returns its results.

#include "python/PythonProvider.h"

#include <flagos/Router.h>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <mutex>
#include <optional>
#include <unordered_map>

namespace py = pybind11;

namespace flagos {
namespace {

class PythonProvider final : public KernelProvider {
 public:
  PythonProvider(std::string name, py::dict kernels) : KernelProvider(std::move(name)) {
    for (auto item : kernels) {
      kernels_.emplace(overloadName(py::cast<std::string>(item.first)), py::reinterpret_borrow<py::object>(item.second));
    }
  }

  ~PythonProvider() override {
    py::gil_scoped_acquire gil;
    kernels_.clear();
  }

  bool canServe(const c10::OperatorHandle& op) const override {
    return kernels_.count(overloadName(op)) != 0;
  }

  void call(const c10::OperatorHandle& op, c10::DispatchKeySet, Stack* stack, const OpSlotInfo&) override {
    const auto& schema = op.schema();
    const size_t nargs = schema.arguments().size();
    auto args = torch::jit::last(*stack, nargs).vec();
    torch::jit::drop(*stack, nargs);

    py::gil_scoped_acquire gil;
    auto found = kernels_.find(overloadName(op));
    TORCH_CHECK(found != kernels_.end(), "flagos: provider '", name(), "' has no kernel for ", op.operator_name());
    // The flagos device of the call (its first flagos tensor's), unless an
    // argument names a device (a copy to another one may return there).
    std::optional<c10::Device> flagos_input;
    bool names_device = false;
    for (const c10::IValue& v : args) {
      // An undefined tensor (a backward's missing gradient) has no device.
      if (!flagos_input && v.isTensor() && v.toTensor().defined() &&
          v.toTensor().device().type() == c10::DeviceType::PrivateUse1) {
        flagos_input = v.toTensor().device();
      }
      names_device = names_device || v.isDevice();
    }
    const std::optional<c10::Device> call_device = names_device ? std::nullopt : flagos_input;
    // The written tensor arguments (in-place self, out=): a kernel must
    // return them, having written them.
    std::vector<std::pair<const c10::AliasInfo*, at::Tensor>> written;
    for (size_t i = 0; i < nargs; ++i) {
      const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
      if (alias != nullptr && alias->isWrite() && args[i].isTensor()) {
        written.emplace_back(alias, args[i].toTensor());
      }
    }
    py::tuple py_args(nargs);
    for (size_t i = 0; i < nargs; ++i) {
      py_args[i] = torch::jit::toPyObject(std::move(args[i]));
    }
    py::object result = found->second(*py_args);

    const auto& returns = schema.returns();
    if (returns.size() == 1) {
      // A lone Tensor result of None is a kernel that forgot to return.
      TORCH_CHECK(
          !result.is_none() || returns[0].real_type()->kind() != c10::TypeKind::TensorType, "flagos: provider '",
          name(), "' returned None for ", op.operator_name(), ", which returns a Tensor (a missing return?)");
      stack->push_back(checkedResult(op, result, returns[0], 0, flagos_input.has_value(), call_device));
      checkWritten(op, stack->back(), returns[0], written);
    } else if (!returns.empty()) {
      TORCH_CHECK(
          py::isinstance<py::tuple>(result) || py::isinstance<py::list>(result), "flagos: provider '", name(),
          "' returned ", py::str(py::type::handle_of(result).attr("__name__")).cast<std::string>(), " for ",
          op.operator_name(), ", which returns ", returns.size(), " values: return a tuple of them");
      auto items = py::cast<py::sequence>(result);
      TORCH_CHECK(
          items.size() == returns.size(), "flagos: provider '", name(), "' returned ", items.size(),
          " values for ", op.operator_name(), ", which returns ", returns.size());
      for (size_t i = 0; i < returns.size(); ++i) {
        stack->push_back(checkedResult(op, items[i], returns[i], i, flagos_input.has_value(), call_device));
        checkWritten(op, stack->back(), returns[i], written);
      }
    }
  }

 private:
  // A result the schema says is a written argument (in-place, out=) must be
  // that tensor: a fresh one would leave the argument as it was, silently.
  void checkWritten(
      const c10::OperatorHandle& op,
      const c10::IValue& result,
      const c10::Argument& ret,
      const std::vector<std::pair<const c10::AliasInfo*, at::Tensor>>& written) const {
    const c10::AliasInfo* alias = ret.alias_info();
    if (alias == nullptr || !alias->isWrite() || !result.isTensor()) {
      return;
    }
    for (const auto& [arg_alias, tensor] : written) {
      if (arg_alias->beforeSets() == alias->beforeSets()) {
        TORCH_CHECK(
            result.toTensor().is_same(tensor), "flagos: provider '", name(), "' returned a new tensor from ",
            op.operator_name(), ", which writes its argument and returns it: write the argument (through "
            "as_native(t) for a native kernel) and return it");
        return;
      }
    }
  }

  // A kernel's result as the schema's type. A Tensor result must be a tensor,
  // or None for an undefined one (a gradient not asked for, attention
  // weights not needed: native kernels return such), and for a call on
  // flagos tensors a flagos one: otherwise the caller got another device's
  // tensor, silently.
  c10::IValue checkedResult(
      const c10::OperatorHandle& op,
      py::handle value,
      const c10::Argument& ret,
      size_t index,
      bool flagos_input,
      const std::optional<c10::Device>& call_device) const {
    if (ret.real_type()->kind() == c10::TypeKind::TensorType) {
      if (value.is_none()) {
        return at::Tensor();
      }
      TORCH_CHECK(
          THPVariable_Check(value.ptr()), "flagos: provider '", name(), "' returned ",
          py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>(), " as result ", index, " of ",
          op.operator_name(), ", which is a Tensor");
      const at::Tensor& t = THPVariable_Unpack(value.ptr());
      TORCH_CHECK(
          !flagos_input || !t.defined() || t.device().type() == c10::DeviceType::PrivateUse1, "flagos: provider '",
          name(), "' returned a tensor on ", t.device(), " as result ", index, " of ", op.operator_name(),
          ", called on flagos tensors: return flagos tensors (.to(the input's device))");
      TORCH_CHECK(
          !call_device || !t.defined() || t.device() == *call_device, "flagos: provider '", name(),
          "' returned a tensor on ", t.device(), " as result ", index, " of ", op.operator_name(),
          ", called on ", *call_device, " tensors: return tensors of the call's device");
    }
    try {
      return torch::jit::toIValue(value, ret.real_type());
    } catch (const std::exception&) {
      TORCH_CHECK(
          false, "flagos: provider '", name(), "' returned ",
          py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>(), " as result ", index, " of ",
          op.operator_name(), ", which is ", ret.real_type()->str());
    }
  }

  std::unordered_map<std::string, py::object> kernels_;
};

} // namespace

void registerPythonProvider(const std::string& name, const py::dict& kernels) {
  for (const auto& existing : providerNames()) {
    TORCH_CHECK(existing != name, "flagos: a provider named '", name, "' is already registered");
  }
  registerProvider(std::make_shared<PythonProvider>(name, kernels));
}

} // namespace flagos
