#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace flagos::cuda {

// Records that `weights` (a layer's, in nn.RNNBase's order) now lie in one
// buffer of `numel` elements as cuDNN lays it out for this layer, so that
// the layer's calls hand cuDNN that buffer while they still lie so
// (CudnnRecurrent.cpp). flagos_cuda/recurrent.py calls it after packing.
void registerFlatWeights(
    const std::vector<at::Tensor>& weights,
    int64_t numel,
    int64_t mode,
    int64_t input_size,
    int64_t hidden_size,
    int64_t proj_size,
    int64_t num_layers,
    bool bidirectional,
    bool has_biases);

} // namespace flagos::cuda
