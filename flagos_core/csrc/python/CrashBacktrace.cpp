// FLAGOS_NATIVE_BACKTRACE=1: on SIGSEGV, SIGBUS or SIGABRT, print the native
// stack of the crashing thread to stderr, then hand the signal to whoever
// held it before (Python's faulthandler prints the Python stacks). For
// crashes inside kernels, where the Python stack stops at the op call.

#include "python/CrashBacktrace.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

namespace flagos {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGABRT};
struct sigaction g_previous[sizeof(kSignals) / sizeof(kSignals[0])];

void onFatalSignal(int sig) {
  static const char header[] = "\nflagos: native stack of the crashing thread:\n";
  (void)!write(STDERR_FILENO, header, sizeof(header) - 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    if (kSignals[i] == sig) {
      sigaction(sig, &g_previous[i], nullptr);
    }
  }
  raise(sig);
}

} // namespace

void installCrashBacktrace() {
  void* warm[1];
  backtrace(warm, 1); // loads libgcc now, not inside the signal handler
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    struct sigaction action = {};
    action.sa_handler = &onFatalSignal;
    sigemptyset(&action.sa_mask);
    sigaction(kSignals[i], &action, &g_previous[i]);
  }
}

} // namespace flagos
