#pragma once

#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <vector>

namespace flagos {

// For flagos_core/_inductor.py: a call of inductor's code for the native
// device converts every argument and result, about a hundred tensors per
// training step of a small model; in Python that cost 3 us a tensor.

// Replaces each flagos tensor in `args` by its native alias (no copy); other
// elements stay.
void nativeArgumentsInPlace(pybind11::list args);

// Replaces the native tensors at `positions` of `results` by flagos tensors
// over the same memory, the one at positions[k] on flagos:<indices[k]>,
// taking over those nothing else holds (as the core's relabelled calls take
// over fresh results).
void flagosResultsInPlace(
    pybind11::list results,
    const std::vector<int64_t>& positions,
    const std::vector<int64_t>& indices);

} // namespace flagos
