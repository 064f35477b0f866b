#pragma once

#include <string>

namespace flagos {
// Native stack on fatal signals, to `path` or stderr if empty (CrashBacktrace.cpp).
void installCrashBacktrace(const std::string& path);
} // namespace flagos
