// FLAGOS_NATIVE_BACKTRACE: on SIGSEGV, SIGBUS or SIGABRT, write the native
// stack of the crashing thread to stderr (value 1) or append it to a file
// (any other value is its path: pytest's capture swallows what a dying
// process writes to stderr), then hand the signal to whoever held it before
// (Python's faulthandler prints the Python stacks). For crashes inside
// kernels, where the Python stack stops at the op call.

#include "python/CrashBacktrace.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace flagos {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGABRT};
struct sigaction g_previous[sizeof(kSignals) / sizeof(kSignals[0])];
char g_path[4096]; // empty: stderr

void onFatalSignal(int sig) {
  const int fd = g_path[0] != 0 ? open(g_path, O_WRONLY | O_CREAT | O_APPEND, 0644) : STDERR_FILENO;
  static const char header[] = "\nflagos: native stack of the crashing thread:\n";
  (void)!write(fd, header, sizeof(header) - 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), fd);
  if (fd != STDERR_FILENO) {
    close(fd);
  }
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    if (kSignals[i] == sig) {
      sigaction(sig, &g_previous[i], nullptr);
    }
  }
  raise(sig);
}

} // namespace

void installCrashBacktrace(const std::string& path) {
  std::strncpy(g_path, path.c_str(), sizeof(g_path) - 1);
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
