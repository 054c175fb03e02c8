#include "file_size_signal.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace trident {
namespace {

// The line the handler writes, made before it is installed: a handler may only call
// async-signal-safe functions. Process-wide because the disposition of a signal is.
char g_line[320];
size_t g_line_size = 0;
bool g_rank_zero = true;

// Every rank hits the limit alike: rank 0 reports it, the others wait a moment for the launcher
// to end them on rank 0's exit before writing their own line (as main()'s fail()).
void on_file_size_signal(int) {
  if (!g_rank_zero) {
    const timespec wait{3, 0};
    ::nanosleep(&wait, nullptr);
  }
  const ssize_t ignored = ::write(STDERR_FILENO, g_line, g_line_size);
  (void)ignored;
  ::_exit(1);
}

// The launcher's rank of this process (MPI's is not known before MPI_Init); -1 if none says.
long launcher_rank() {
  for (const char* name : {"PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::atol(v);
  return -1;
}

}  // namespace

void fail_on_file_size_signal() {
  rlimit limit{};
  const bool known = ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
  char size[64] = "";
  if (known)
    std::snprintf(size, sizeof size, " of %llu bytes (%llu KiB)",
                  static_cast<unsigned long long>(limit.rlim_cur),
                  static_cast<unsigned long long>(limit.rlim_cur / 1024));
  const long rank = launcher_rank();
  g_rank_zero = rank <= 0;
  char on_rank[32] = "";
  if (!g_rank_zero) std::snprintf(on_rank, sizeof on_rank, " on rank %ld", rank);
  const int n = std::snprintf(
      g_line, sizeof g_line,
      "trident: error%s: MPI's start-up wrote beyond the file-size limit (ulimit -f)%s (its "
      "shared-memory files take several MB); raise the limit (ulimit -f unlimited)\n",
      on_rank, size);
  g_line_size = n < 0 ? 0 : std::min(static_cast<size_t>(n), sizeof g_line - 1);
  struct sigaction action {};
  action.sa_handler = on_file_size_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGXFSZ, &action, nullptr);
}

void ignore_file_size_signal() { std::signal(SIGXFSZ, SIG_IGN); }

}  // namespace trident
