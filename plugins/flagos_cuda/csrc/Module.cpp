#include "CudaRuntime.h"
#include "CudnnRecurrent.h"
#include "FlashAttention.h"

#include <flagos/Export.h>

#include <torch/csrc/utils/pybind.h>

PYBIND11_MODULE(_C, m) {
  m.doc() = "flagos-cuda bindings";
  m.attr("PLUGIN_ABI_VERSION") = flagos::kPluginAbiVersion;
  m.def("activate", &flagos::cuda::activate);
  m.def("register_flash_provider", &flagos::cuda::registerFlashAttentionProvider);
  m.def("register_flat_weights", &flagos::cuda::registerFlatWeights);
}
