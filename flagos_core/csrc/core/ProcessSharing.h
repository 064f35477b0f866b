#pragma once

// flagos tensors sent to another process through torch.multiprocessing
// (flagos_core/_multiprocessing.py): on the host runtime their storage moves
// into shared memory first, as a CPU storage does.

#include <flagos/Export.h>

#include <ATen/core/Tensor.h>

namespace flagos {

// The whole native storage whose memory a flagos tensor's storage uses, as a
// byte tensor of the native device; undefined where the storage uses an
// allocation of its own.
FLAGOS_API at::Tensor wrappedNativeBytes(const at::Tensor& flagos);

// Moves a flagos tensor's storage (host runtime) onto `bytes`, a CPU byte
// tensor over a whole storage of the same size, in place: every flagos tensor
// over the storage uses that memory from then on.
FLAGOS_API void moveStorageOnto(const at::Tensor& flagos, const at::Tensor& bytes);

} // namespace flagos
