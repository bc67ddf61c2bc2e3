// mpi::Session: MPI for the lifetime of a process that mpirun (or srun) started.
//
//   int main(int argc, char** argv) {
//     weft::mpi::Session mpi(argc, argv);
//     try {
//       auto world = weft::mpi::MpiComm::world();     // every process, rank order as mpirun numbers them
//       ...
//       return mpi.finish(0);
//     } catch (const std::exception& e) {
//       std::fprintf(stderr, "%s\n", e.what());
//       return mpi.finish(1);
//     }
//   }
//
// finish(0) finalizes MPI. finish(code != 0) exits without MPI_Finalize, half a second after flushing
// (so the other ranks, failing too, print their errors before mpirun stops them): a peer may be
// dead or stalled, and finalizing waits for every rank; mpirun sees the exit and stops the others.
//
// SIGTERM and SIGINT (mpirun sends SIGTERM to every rank when one dies or is interrupted): a rank
// waiting in a weft call throws weft::Error naming the failure that ended the job (or, when no
// notice has come, the call and the ranks it waited for); a rank computing gets one second (SIGALRM)
// to reach its next weft call, which does the same, or prints one line and ends with the signal's
// default action; a rank already raising an error goes on; a second signal stops at once.
#pragma once

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "weft/comm/mpi/world.hpp"
#include "weft/core/error.hpp"

namespace weft::mpi {

namespace detail {
inline char stop_line[160];
inline std::size_t stop_line_len = 0;

// Out of time to reach a weft call after a stop signal: say so and end as the signal would.
inline void on_alarm(int) {
  (void)!::write(2, stop_line, stop_line_len);
  const int sig = stop_signal().load();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

inline void on_stop(int sig) {
  if (stop_signal().exchange(sig) != 0 && !failing().load()) on_alarm(0);  // a second signal: stop now
  if (failing().load()) return;  // already on its way out with an error message
  // A rank in a weft call sees the flag at once; one computing gets a second to reach its next call,
  // which raises an Error naming the failure that made the launcher stop the job.
  if (waiting().load() == 0) ::alarm(1);
}
}  // namespace detail

class Session {
 public:
  Session(int& argc, char**& argv) {
    int provided = 0;
    check(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread", "mpi::Session");
    if (provided < MPI_THREAD_FUNNELED)
      throw Error("mpi::Session",
                  cat("the MPI library provides thread level ", provided, ", below MPI_THREAD_FUNNELED"),
                  "use an MPI built with thread support (Debian's Open MPI is)");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    const std::string line =
        cat("weft: world rank ", rank_, " stopped by a signal and did not reach a weft call within 1 s\n");
    detail::stop_line_len = std::min(line.size(), sizeof detail::stop_line);
    std::memcpy(detail::stop_line, line.data(), detail::stop_line_len);
    struct sigaction sa = {};
    sa.sa_handler = detail::on_stop;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    sa.sa_handler = detail::on_alarm;
    ::sigaction(SIGALRM, &sa, nullptr);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    if (!finished_) finish(std::uncaught_exceptions() ? 1 : 0);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Ends MPI: finalizes after success; after a failure, exits with `code` without finalizing.
  int finish(int code) {
    finished_ = true;
    if (code != 0) {
      std::fflush(stdout);
      std::fflush(stderr);
      // The first rank to exit makes mpirun stop the others: give them half a second to report too.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      std::_Exit(code);
    }
    MPI_Finalize();
    return 0;
  }

 private:
  int rank_ = 0, size_ = 1;
  bool finished_ = false;
};

}  // namespace weft::mpi
