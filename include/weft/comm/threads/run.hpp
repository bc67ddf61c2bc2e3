// run_threads(n, fn): runs fn(ThreadComm& world) on n threads, one per rank, and returns when all
// have returned.
//
// When a rank throws, every other rank's next (or current) collective throws weft::Error naming it,
// and run_threads rethrows the first failure on the calling thread. A rank that is stuck outside any
// collective (an endless loop in user code) cannot be interrupted; run_threads waits for it for one
// deadline plus one second after the first failure, then detaches it and reports it instead of
// hanging. fn is copied into state shared with the threads, so a detached rank never outlives it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <type_traits>
#include <vector>

#include "weft/comm/threads/thread_comm.hpp"

namespace weft {

using threads::ThreadComm;

template <class Fn>
  requires std::invocable<Fn&, ThreadComm&>
void run_threads(int n, Fn&& fn, threads::Options opts = {}) {
  constexpr int max_ranks = 1024;
  if (n < 1 || n > max_ranks)
    throw Error("run_threads", cat(n, " ranks requested"), cat("use 1 to ", max_ranks, " ranks"));
  if (opts.deadline.count() <= 0)
    throw Error("run_threads", cat("deadline of ", opts.deadline.count(), " ms"), "use a positive deadline");

  auto world = std::make_shared<threads::World>(n, opts);
  std::vector<int> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  auto group = world->make_group("world", all);

  struct Shared {
    Shared(int n, Fn&& f) : finished(static_cast<std::size_t>(n)), fn(std::forward<Fn>(f)) {}
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    std::vector<bool> finished;
    std::decay_t<Fn> fn;
  };
  auto shared = std::make_shared<Shared>(n, std::forward<Fn>(fn));

  std::vector<std::thread> ranks;
  ranks.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([world, group, shared, r] {
      try {
        ThreadComm comm(world, group, r);
        shared->fn(comm);
      } catch (const threads::FailedElsewhere& e) {
        world->fail(r, e.what(), true);  // an echo: the cause, when it comes, is reported instead
      } catch (const std::exception& e) { world->fail(r, e.what()); } catch (...) {
        world->fail(r, "an exception that is not a std::exception");
      }
      world->exited(r);
      std::lock_guard lock(shared->mu);
      shared->finished[static_cast<std::size_t>(r)] = true;
      ++shared->done;
      shared->cv.notify_all();
    });

  // Wait for every rank; after a failure, give the others one deadline plus a second to stop.
  std::unique_lock lock(shared->mu);
  std::chrono::steady_clock::time_point give_up = std::chrono::steady_clock::time_point::max();
  while (shared->done < n) {
    if (give_up == std::chrono::steady_clock::time_point::max() && world->failure())
      give_up = std::chrono::steady_clock::now() + opts.deadline + std::chrono::seconds(1);
    if (std::chrono::steady_clock::now() >= give_up) break;
    shared->cv.wait_for(lock, std::chrono::milliseconds(20));
  }
  std::vector<int> stuck;
  for (int r = 0; r < n; ++r) {
    if (shared->finished[static_cast<std::size_t>(r)]) {
      ranks[static_cast<std::size_t>(r)].join();
    } else {
      ranks[static_cast<std::size_t>(r)].detach();
      stuck.push_back(r);
    }
  }
  lock.unlock();

  if (auto f = world->failure()) {
    std::string what = cat("world rank ", f->rank, " failed: ", f->why);
    if (!stuck.empty())
      what += cat(" (world ranks ", join(stuck), " did not return within the deadline plus 1 s and were detached)");
    throw Error("run_threads", what, "fix the first failure; the other ranks stopped because of it");
  }
}

}  // namespace weft
