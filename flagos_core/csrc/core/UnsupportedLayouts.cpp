// Sparse and quantized tensors on flagos: not supported (flagos tensors are
// strided). Without these kernels such a call ends in the dispatcher's
// generic "Could not run ... from the 'Sparseflagos' backend", or in a
// composite kernel's misleading layout check, neither of which says what to
// do instead.
//
// A compressed sparse tensor (CSR, CSC, BSR, BSC) can still land on flagos:
// its constructor and `.to("flagos")` build it from dense flagos parts
// without a per-backend call. Such a tensor keeps its parts readable
// (crow_indices, values, ...) so that `.cpu()`, `.to_dense()` and printing
// work, as the error's advice says; every computing op raises.

#include <flagos/Router.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_to_dense_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <torch/library.h>

namespace flagos {
namespace {

// The device of the first tensor argument for which `test` holds, if any.
template <class Test>
std::optional<c10::Device> deviceWhere(const c10::OperatorHandle& op, const torch::jit::Stack& stack, Test test) {
  const size_t count = op.schema().arguments().size();
  for (size_t i = stack.size() - std::min(count, stack.size()); i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (value.isTensor() && value.toTensor().defined() && test(value.toTensor())) {
      return value.toTensor().device();
    }
    if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList().vec()) {
        if (t.defined() && test(t)) {
          return t.device();
        }
      }
    }
  }
  return std::nullopt;
}

// A sparse or quantized tensor of another device beside a flagos tensor
// reaches these kernels too (the flagos tensor picks the backend): then the
// devices are what is wrong, not flagos's layouts.
void refuseOtherDevice(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const char* kind,
                       const char* remedy, bool (*is_kind)(const at::Tensor&)) {
  const auto on_flagos = deviceWhere(op, stack, [&](const at::Tensor& t) {
    return is_kind(t) && t.device().type() == c10::DeviceType::PrivateUse1;
  });
  const auto elsewhere = deviceWhere(op, stack, is_kind);
  const auto flagos = deviceWhere(op, stack, [](const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; });
  if (!on_flagos.has_value() && elsewhere.has_value() && flagos.has_value()) { // not a move to flagos (.to)
    TORCH_CHECK(
        false, "flagos: ", op.operator_name(), " was called with a ", kind, " tensor on ", elsewhere->str(),
        " and a tensor on a flagos device: a call's tensors must be on one device. Move the flagos tensors to ",
        elsewhere->str(), ", or ", remedy, " and move the result to flagos.");
  }
}

bool isSparse(const at::Tensor& t) {
  return t.layout() != c10::kStrided;
}

bool isQuantized(const at::Tensor& t) {
  return t.is_quantized();
}

void sparseKernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  refuseOtherDevice(op, *stack, "sparse", "make the sparse tensor dense first (.to_dense())", &isSparse);
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "flagos: ", op.operator_name(),
      " was called with a sparse tensor on a flagos device, and flagos holds strided (dense) tensors only. Keep "
      "sparse tensors on the CPU, or make them dense first (.to_dense()) and move the dense tensor to flagos.");
}

void quantizedKernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  refuseOtherDevice(op, *stack, "quantized", "dequantize it first (.dequantize())", &isQuantized);
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "flagos: ", op.operator_name(),
      " was called with a quantized tensor on a flagos device, and flagos holds unquantized tensors only. Keep "
      "quantized tensors on the CPU, or dequantize them first (.dequantize()) and move the result to flagos.");
}

// Every op the CPU has a compressed-sparse kernel for, and flagos does not
// serve (the block at the end of this file), raises the sparse error. The
// fallback alone would not do: an op with a composite kernel (add, mul, ...)
// runs that instead, which fails with "unsupported tensor layout".
// Registered once, when the core loads (aten's ops are all known by then).
void registerCompressedSparseErrors() {
  static torch::Library* library = new torch::Library( // never destroyed: kernels may run at exit
      torch::Library::IMPL, "aten", c10::DispatchKey::SparseCsrPrivateUse1, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) {
      continue;
    }
    auto op = dispatcher.findOp(name);
    if (op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::SparseCsrCPU) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::SparseCsrPrivateUse1)) {
      library->impl(overloadName(*op).c_str(), torch::CppFunction::makeFromBoxedFunction<&sparseKernel>());
    }
  }
}

} // namespace
} // namespace flagos

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&flagos::sparseKernel>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&flagos::sparseKernel>());
}
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&flagos::quantizedKernel>());
}

// What a compressed sparse tensor on flagos still serves: reading its parts
// (dense flagos tensors) and making it dense, with ATen's own kernels for
// these layouts, which call only dense ops on the parts.
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
  m.impl("_to_dense", TORCH_FN(at::native::sparse_compressed_to_dense));
}

namespace {
// After the block above (same file: static initialisers run in order), so
// the served ops already have their kernel and are left alone.
const bool compressed_sparse_errors_registered = (flagos::registerCompressedSparseErrors(), true);
} // namespace
