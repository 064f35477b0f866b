#pragma once

// Autocast for flagos tensors (the AutocastPrivateUse1 dispatch key).

#include <string>

namespace torch {
class Library;
}

namespace flagos {

// Casts under torch.autocast("flagos") as native device `device` casts under
// its own autocast, with that device's policy lists. Known: "cuda" (the
// lists ATen/autocast_mode.h keeps for CUDA) and "cpu" (AutocastCpuPolicies.cpp,
// the host runtime's). Once per process; a second call with another device
// raises.
void useAutocastPolicies(const std::string& device);

// CPU's policies, registered on `m` (AutocastPrivateUse1).
void registerCpuPolicies(torch::Library& m);

// The device whose policies are in use, or "" (then ops run uncast).
std::string autocastPolicies();

} // namespace flagos
