#pragma once

namespace flagos::cuda {

// Makes the CUDA runtime the process's flagos runtime and `cuda` the
// default provider.
void activate();

} // namespace flagos::cuda
