// SIGINT, SIGTERM, SIGHUP (a closed terminal or ssh session) and SIGUSR1 for a trainer: the first
// asks the run to stop after the current step
// (every rank at the same step: the flag travels in the step's all-reduce), or part-way through it
// when steps take over half a second (train/stop.hpp: polled about every 0.25 s, the step abandoned
// on every rank at the same point), writing a checkpoint when a save directory is set; a second
// ends the process at once. Under mpirun only SIGUSR1 is installed: mpirun answers SIGINT and
// SIGTERM by sending SIGTERM to every rank and killing the job moments later (mpi::Session turns
// that SIGTERM into an error on every rank), but forwards SIGUSR1 and lets the job run on, so
// `kill -USR1 <mpirun>` is the clean stop there.
#pragma once

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

namespace weft::train {

// The first signal's number, 0 while none came.
inline std::atomic<int>& stop_requested() {
  static std::atomic<int> signal{0};
  return signal;
}

// When the first signal came (CLOCK_MONOTONIC nanoseconds, steady_clock's on Linux).
inline std::atomic<std::int64_t>& stop_time_ns() {
  static std::atomic<std::int64_t> ns{0};
  return ns;
}

namespace detail {
// The line the handler writes, composed before any signal can come (write(2) is all a handler may call).
inline char stop_line[256] =
    "stopping after this step, or within a second if it is long (a second signal stops at once)\n";
}  // namespace detail

inline void on_stop_signal(int sig) {
  if (stop_requested().exchange(sig) != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  stop_time_ns().store(static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec);
  (void)!::write(2, detail::stop_line, std::strlen(detail::stop_line));
}

// program: the name the handler's line starts with ("weft-train").
inline void install_stop_handlers(bool under_mpirun, const std::string& program) {
  const std::string line =
      program + ": stopping after this step, or within a second if it is long (a second signal stops at once)\n";
  const std::size_t n = std::min(line.size(), sizeof detail::stop_line - 1);
  std::memcpy(detail::stop_line, line.data(), n);
  detail::stop_line[n] = '\0';
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // file and socket calls resume rather than fail with EINTR
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  if (under_mpirun) return;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
}

inline const char* signal_name(int sig) {
  return sig == SIGINT    ? "SIGINT"
         : sig == SIGTERM ? "SIGTERM"
         : sig == SIGHUP  ? "SIGHUP"
         : sig == SIGUSR1 ? "SIGUSR1"
                          : "a signal";
}

}  // namespace weft::train
