// Sparse and quantized tensors on flagos: not supported (flagos tensors are
// strided). Without these fallbacks such a call ends in the dispatcher's
// generic "Could not run ... from the 'Sparseflagos' backend", which says
// nothing of what to do instead.

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace flagos {
namespace {

void sparseKernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "flagos: ", op.operator_name(),
      " was called with a sparse tensor on a flagos device, and flagos holds strided (dense) tensors only. Keep "
      "sparse tensors on the CPU, or make them dense first (.to_dense()) and move the dense tensor to flagos.");
}

void quantizedKernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "flagos: ", op.operator_name(),
      " was called with a quantized tensor on a flagos device, and flagos holds unquantized tensors only. Keep "
      "quantized tensors on the CPU, or dequantize them first (.dequantize()) and move the result to flagos.");
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
