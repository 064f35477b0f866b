#include "python/CompiledCalls.h"

#include <flagos/Relabel.h>
#include <flagos/Runtime.h>

#include <torch/csrc/autograd/python_variable.h>

namespace flagos {

void nativeArgumentsInPlace(pybind11::list args) {
  const size_t n = args.size();
  for (size_t i = 0; i < n; ++i) {
    PyObject* item = PyList_GET_ITEM(args.ptr(), i);
    if (!THPVariable_Check(item)) {
      continue;
    }
    const at::Tensor& t = THPVariable_Unpack(item);
    if (t.device().type() != c10::DeviceType::PrivateUse1) {
      continue;
    }
    at::Tensor native = toNative(t, activeRuntime().nativeDevice(t.device().index()));
    args[i] = pybind11::reinterpret_steal<pybind11::object>(THPVariable_Wrap(std::move(native)));
  }
}

void flagosResultsInPlace(
    pybind11::list results,
    const std::vector<int64_t>& positions,
    const std::vector<int64_t>& indices) {
  TORCH_CHECK(positions.size() == indices.size(), "flagos: ", positions.size(), " result positions, ", indices.size(), " devices");
  for (int64_t index : indices) {
    activeRuntime().checkIndex(static_cast<c10::DeviceIndex>(index));
  }
  const auto size = static_cast<int64_t>(results.size());
  for (size_t k = 0; k < positions.size(); ++k) {
    const int64_t i = positions[k];
    const auto index = static_cast<c10::DeviceIndex>(indices[k]);
    TORCH_CHECK(i >= 0 && i < size, "flagos: result position ", i, " out of ", size);
    PyObject* item = PyList_GET_ITEM(results.ptr(), i);
    if (!THPVariable_Check(item)) {
      continue;
    }
    at::Tensor native = THPVariable_Unpack(item);
    if (!native.defined() || native.device().type() != activeRuntime().nativeDeviceType()) {
      continue;
    }
    // The list's reference goes first, so a result the compiled code no
    // longer holds is taken over rather than wrapped.
    results[i] = pybind11::none();
    results[i] = pybind11::reinterpret_steal<pybind11::object>(
        THPVariable_Wrap(adoptNative(std::move(native), index)));
  }
}

} // namespace flagos
