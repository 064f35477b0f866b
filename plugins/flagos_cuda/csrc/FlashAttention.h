#pragma once

namespace flagos::cuda {

// The `cuda_flash` provider (routed by the plugin's conf, confs/cuda.yaml).
void registerFlashAttentionProvider();

} // namespace flagos::cuda
