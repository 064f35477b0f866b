#pragma once

// Symbols of libflagos_core that plugins link against.
#if defined(FLAGOS_BUILDING_CORE)
#define FLAGOS_API __attribute__((visibility("default")))
#else
#define FLAGOS_API
#endif

namespace flagos {
// Bumped whenever a header under include/flagos changes in a way that breaks
// plugins compiled against an older core. Plugins report the value they were
// built with; the core refuses a mismatch.
constexpr int kPluginAbiVersion = 2;
} // namespace flagos
