// Faults in the thread back end: a rank that throws, a rank that stalls past the deadline, a rank
// that returns early, and a deadlock (mismatched collectives: mismatch.cpp, shared with MPI). Every
// rank must get a weft::Error naming the failing rank, the op and its sequence number, within the
// stated time: "at once" is within test::kSchedulingMargin (the 60 s deadline is far beyond it), "at
// the deadline" is not before it and within the margin after it.
// Each case runs 20 times; CTest's TIMEOUT turns a hang into a failure.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "support/ranks.hpp"

using namespace weft;
using namespace std::chrono_literals;
using test::Clock;
using test::Outcome;
using test::run_faulty;

TEST_CASE("a rank that throws: every other rank raises Error naming it the op and its number at once") {
  double worst = 0;
  for (int iter = 0; iter < 20; ++iter) {
    // The default 60 s deadline: the others must not wait for it.
    auto [out, top] = run_faulty(4, 60s, [](ThreadComm& c, Clock::time_point& start) {
      std::vector<float> v(100, 1.0f);
      c.all_reduce(std::span<float>(v));
      c.all_reduce(std::span<float>(v));
      start = Clock::now();
      if (c.rank() == 2) throw std::runtime_error("boom in the forward pass");
      c.all_reduce(std::span<float>(v));  // #3
    });
    REQUIRE(out.size() == 4);
    for (const Outcome& o : out) {
      worst = std::max(worst, o.seconds);
      if (o.rank == 2) continue;
      CHECK(o.weft_error);
      CHECK_MESSAGE(o.message.find("all_reduce #3 on world{0,1,2,3}") != std::string::npos, o.message);
      CHECK_MESSAGE(
          o.message.find("aborted because world rank 2 failed: boom in the forward pass") != std::string::npos,
          o.message);
      CHECK(o.seconds < test::kSchedulingMargin);  // at once: the 60 s deadline is not waited for
    }
    CHECK(top ==
          "run_threads: world rank 2 failed: boom in the forward pass; fix the first failure; the other "
          "ranks stopped because of it");
  }
  MESSAGE("throw: slowest rank raised its Error after ", worst, " s");
}

TEST_CASE("a rank that stalls past the deadline: every rank raises Error at the deadline") {
  // Each waiting rank's deadline runs from its own entry into the call; the first to reach it fails
  // the call for the others, which raise at once. So in every run the slowest of them waited at least
  // the deadline from its start, and the others, which may have started later (threads are scheduled
  // apart: 10 ms and more under ThreadSanitizer on 2 busy cores), raised up to that much sooner.
  double worst = 0, earliest = 1e9, shortest_wait = 1e9;
  const auto d = 200ms;
  for (int iter = 0; iter < 20; ++iter) {
    auto [out, top] = run_faulty(4, d, [&](ThreadComm& c, Clock::time_point& start) {
      std::vector<double> v(64, 1.0);
      c.all_reduce(std::span<double>(v));
      start = Clock::now();
      if (c.rank() == 1) std::this_thread::sleep_for(2 * d);  // misses all_reduce #2's deadline
      c.all_reduce(std::span<double>(v));
    });
    REQUIRE(out.size() == 4);
    double longest = 0;  // in this run
    for (const Outcome& o : out) {
      CHECK(o.weft_error);
      CHECK_MESSAGE(o.message.find("world rank 1") != std::string::npos, o.message);
      CHECK_MESSAGE(o.message.find("did not reach all_reduce #2 on world{0,1,2,3} within the 200 ms deadline") !=
                        std::string::npos,
                    o.message);
      if (o.rank == 1) continue;  // the stalled rank learns of it when it wakes
      worst = std::max(worst, o.seconds);
      earliest = std::min(earliest, o.seconds);
      longest = std::max(longest, o.seconds);
      CHECK(o.seconds < 0.2 + test::kSchedulingMargin);
    }
    CHECK(longest >= 0.2);  // nobody gave up before the deadline
    shortest_wait = std::min(shortest_wait, longest);
    CHECK(top.find("run_threads: world rank 1 failed") == 0);
  }
  MESSAGE("stall: waiting ranks raised their Error after ", earliest, " to ", worst,
          " s; the first to give up waited at least ", shortest_wait, " s (deadline 0.2 s)");
}

TEST_CASE("a deadlock across ops and groups is reported at once not at the deadline") {
  for (int iter = 0; iter < 20; ++iter) {
    // Rank 0 waits in all_reduce for rank 1; rank 1 waits in a send for rank 0's recv.
    auto [out, top] = run_faulty(2, 60s, [](ThreadComm& c, Clock::time_point&) {
      std::vector<float> v(3);
      if (c.rank() == 0) c.all_reduce(std::span<float>(v));
      else c.send(std::span<const float>(v), 0);
    });
    REQUIRE(out.size() == 2);
    for (const Outcome& o : out) {
      CHECK(o.weft_error);
      CHECK_MESSAGE(o.message.find("deadlock: world rank ") != std::string::npos, o.message);
      CHECK(o.seconds < test::kSchedulingMargin);  // at once: the 60 s deadline is not waited for
    }
    CHECK(top.find("deadlock") != std::string::npos);
  }
}

TEST_CASE("a rank that returns without making the call is named at once") {
  for (int iter = 0; iter < 20; ++iter) {
    auto [out, top] = run_faulty(3, 60s, [](ThreadComm& c, Clock::time_point&) {
      if (c.rank() == 2) return;
      c.barrier();
    });
    REQUIRE(out.size() == 2);
    for (const Outcome& o : out)
      CHECK_MESSAGE(o.message.find("world rank 2 returned from its function without calling barrier #1 on "
                                   "world{0,1,2}") != std::string::npos,
                    o.message);
  }
}

TEST_CASE("a rank stuck outside any collective is detached after the deadline plus 1 s not waited for") {
  // The stuck rank stays stuck until the test releases it (or 20 s pass), so run_threads must return
  // while it is still stuck: that, not a clock, shows it was detached. The clock shows it first gave
  // the ranks the deadline plus 1 s. Static: the detached thread reads them after this scope's end.
  static std::atomic<bool> release{false}, returned{false};
  const auto start = Clock::now();
  auto [out, top] = run_faulty(2, 100ms, [](ThreadComm& c, Clock::time_point&) {
    if (c.rank() == 0) throw std::runtime_error("fails first");
    for (const auto until = Clock::now() + 20s; !release.load() && Clock::now() < until;)
      std::this_thread::sleep_for(1ms);  // never reaches a collective in time
    returned = true;
  });
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(!returned.load());  // detached, not waited for
  CHECK(took >= 0.1 + 1.0 - 0.02);
  CHECK(took < 0.1 + 1.0 + test::kSchedulingMargin);
  CHECK_MESSAGE(top.find("world rank 0 failed: fails first (world ranks 1 did not return within the deadline plus 1 "
                         "s and were detached)") != std::string::npos,
                top);
  release = true;  // let the detached rank finish before the process moves on
  while (!returned.load()) std::this_thread::sleep_for(1ms);
  MESSAGE("detached after ", took, " s (the deadline 0.1 s plus 1 s)");
}

TEST_CASE("bad arguments raise Error naming the values on the calling rank and the others") {
  auto [out, top] = run_faulty(2, 60s, [](ThreadComm& c, Clock::time_point&) {
    std::vector<float> in(4), out(7);
    if (c.rank() == 0) c.all_gather(std::span<const float>(in), std::span<float>(out));
    else c.barrier();
  });
  REQUIRE(out.size() == 2);
  CHECK(top.find("all_gather #1 on world{0,1} at world rank 0: sizes in 4, out 7 on 2 ranks break out.size() == "
                 "size() * in.size()") != std::string::npos);
  CHECK_THROWS_WITH_AS(run_threads(0, [](ThreadComm&) {}), "run_threads: 0 ranks requested; use 1 to 1024 ranks",
                       Error);
}
