#pragma once

#include <c10/core/Device.h>

namespace flagos::host {

// Activates the host runtime with `devices` flagos devices and makes the
// `host` provider the default route.
void activateHostRuntime(c10::DeviceIndex devices);

} // namespace flagos::host
