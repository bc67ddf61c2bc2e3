// test::run_ranks(n, fn, deadline): fn(test::World&) on n ranks, for the tests that run on both
// back ends. In the ordinary test binaries the ranks are threads (run_threads); in the binaries
// built with WEFT_TEST_MPI (started by mpirun -np 4) they are the first n processes, and the
// others skip the call. Either way a failure on any rank throws Error("run_threads: world rank K
// failed: <why>") on the ranks that ran, and local_ranks(n) says how many of the n ranks run in this
// process (all of them on threads, one or none under MPI) and holds_rank(r) whether rank r does, for
// tests that gather results per process.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "weft/comm/threads/run.hpp"
#ifdef WEFT_TEST_MPI
#include "weft/comm/mpi/mpi_comm.hpp"
#endif

namespace weft::test {

// How late, in seconds, a rank may learn of a failure (or a deadline pass) that it should learn of
// at once, and still pass: the time for the failing rank's thread or process to be scheduled, the
// waiter to wake and its Error to be built. Measured on a 2-core machine with two compiles of
// weft-train beside the tests (dev preset, 2026-12-03): a failure learnt "at once" after at most
// 0.013 s (threads, MPI, the pipeline), a deadline passed by at most 0.004 s on threads, 0.012 s
// for the detach, 0.005 s for TcpStore, and 0.016 s under MPI past the deadline and its grace (the
// waiting processes collect each other's notices for min(deadline, 1 s): comm/mpi/world.hpp). 2 s
// keeps a margin over all of them, and the alternatives these tests tell apart (a 60 s deadline, a
// rank stuck for 20 s) are far beyond it.
inline constexpr double kSchedulingMargin = 2.0;

#ifdef WEFT_TEST_MPI
using World = weft::mpi::MpiComm;

inline int process_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int processes() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
// Whether a test of n ranks runs at all (the job has at least n processes).
inline bool runs(int n) { return n <= processes(); }
inline int local_ranks(int n) { return process_rank() < n ? 1 : 0; }
inline bool holds_rank(int r) { return process_rank() == r; }

template <class Fn>
void run_ranks(int n, Fn&& fn, std::chrono::milliseconds deadline = std::chrono::milliseconds(60'000)) {
  if (!runs(n)) return;
  auto all = World::world({.deadline = deadline});
  auto ranks = all.split(all.rank() < n ? 0 : 1, all.rank(), "world");
  if (all.rank() >= n) return;
  try {
    weft::mpi::run(ranks, fn);
  } catch (const weft::threads::FailedElsewhere& e) {
    // "<call>: aborted because world rank K failed: <why>; fix the first failure; ...": report the cause.
    std::string what = e.what();
    if (const auto at = what.find("aborted because "); at != std::string::npos) what = what.substr(at + 16);
    if (const auto fix = what.rfind("; fix the first failure"); fix != std::string::npos) what.resize(fix);
    throw weft::Error("run_threads", what, "fix the first failure; the other ranks stopped because of it");
  } catch (const std::exception& e) {
    throw weft::Error("run_threads", weft::cat("world rank ", all.rank(), " failed: ", e.what()),
                      "fix the first failure; the other ranks stopped because of it");
  }
}
#else
using World = weft::ThreadComm;

inline bool runs(int) { return true; }
inline int local_ranks(int n) { return n; }
inline bool holds_rank(int) { return true; }

template <class Fn>
void run_ranks(int n, Fn&& fn, std::chrono::milliseconds deadline = std::chrono::milliseconds(60'000)) {
  weft::run_threads(n, std::forward<Fn>(fn), {.deadline = deadline});
}
#endif

using Clock = std::chrono::steady_clock;

struct Outcome {
  int rank = -1;
  bool weft_error = false;
  std::string message;
  double seconds = 0;  // from entering the failing call to the exception
};

// Runs fn on n ranks; fn(comm, start) sets start just before the call that should fail. Returns what
// each rank of this process saw, and the message run_ranks rethrew.
template <class Fn>
std::pair<std::vector<Outcome>, std::string> run_faulty(int n, std::chrono::milliseconds deadline, Fn fn) {
  std::mutex mu;
  std::vector<Outcome> out;
  std::string top;
  try {
    run_ranks(
        n,
        [&](World& c) {
          Clock::time_point start = Clock::now();
          auto record = [&](bool weft_error, const char* what) {
            std::lock_guard lock(mu);
            out.push_back({c.rank(), weft_error, what, std::chrono::duration<double>(Clock::now() - start).count()});
          };
          try {
            fn(c, start);
          } catch (const weft::Error& e) {
            record(true, e.what());
            throw;
          } catch (const std::exception& e) {
            record(false, e.what());
            throw;
          }
        },
        deadline);
  } catch (const weft::Error& e) { top = e.what(); }
  return {out, top};
}

}  // namespace weft::test
