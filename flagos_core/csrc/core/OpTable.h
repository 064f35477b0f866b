#pragma once

#include <cstddef>

namespace flagos::generated {

// One routable ATen overload (see codegen/gen_op_table.py).
struct OpTableRow {
  const char* overload; // "add.Tensor", "view" (no overload name)
  bool exact_device; // native_functions.yaml device_check: ExactSame
  // Served by a generated typed kernel: TypedKernels*.cpp, or for a
  // composite op run whole on the native device, WholeKernels.cpp.
  bool typed;
};

extern const OpTableRow kOpTable[];
extern const size_t kOpTableSize;

} // namespace flagos::generated
