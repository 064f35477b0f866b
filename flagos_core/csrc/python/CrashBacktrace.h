#pragma once

namespace flagos {
// Native stack on fatal signals (FLAGOS_NATIVE_BACKTRACE=1; CrashBacktrace.cpp).
void installCrashBacktrace();
} // namespace flagos
