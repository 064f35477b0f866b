#pragma once

// torch.distributed collectives on flagos tensors (c10d:: operators).

#include <flagos/Export.h>

#include <string>
#include <vector>

namespace flagos {

// Serves every c10d:: collective for flagos tensors on the native device's
// communication backend, in place of PyTorch's PrivateUse1 kernels. Once per
// process; returns the operators served.
FLAGOS_API std::vector<std::string> serveCollectives();

} // namespace flagos
