// What only the MPI back end needs: results bitwise those of the thread back end where the order
// of a float sum shows in the bits, failures named on every process within the deadline, and sends
// in flight. Runs under mpirun -np 4 (comm_mpi).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "support/ranks.hpp"
#include "weft/core/philox.hpp"

using namespace weft;
using namespace std::chrono_literals;
using test::Clock;

namespace {

// Values of very different magnitude per rank, so a float sum in any other order differs in the bits.
template <class T>
T spread_value(int rank, std::size_t i, std::uint64_t salt) {
  const double v = normal(salt, static_cast<std::uint64_t>(rank), i) * std::pow(10.0, (rank * 3) % 7);
  if constexpr (std::is_same_v<T, bf16>) return bf16(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// all_reduce (count elements) and reduce_scatter (count per rank) of rank `me` on `c`.
template <class T, class C>
std::pair<std::vector<T>, std::vector<T>> reductions(C& c, std::size_t count, ReduceOp op, std::uint64_t salt) {
  const int me = c.rank(), n = c.size();
  std::vector<T> ar(count), in(count * static_cast<std::size_t>(n)), rs(count);
  for (std::size_t i = 0; i < ar.size(); ++i) ar[i] = spread_value<T>(me, i, salt);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = spread_value<T>(me, i, salt + 1);
  c.all_reduce(std::span<T>(ar), op);
  c.reduce_scatter(std::span<const T>(in), std::span<T>(rs), op);
  return {ar, rs};
}

}  // namespace

TEST_CASE_TEMPLATE("MPI reductions are bitwise those of the thread back end (rank-order sums)", T, float, double,
                   bf16) {
  REQUIRE(test::processes() == 4);
  std::uint64_t salt = 100;
  for (const std::size_t count : {std::size_t{1}, std::size_t{5}, std::size_t{1001}, std::size_t{4099}}) {
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      salt += 2;
      CAPTURE(count);
      CAPTURE(name(op));
      std::pair<std::vector<T>, std::vector<T>> mpi, threads;
      test::run_ranks(4, [&](test::World& c) { mpi = reductions<T>(c, count, op, salt); });
      // The same four ranks as threads of this process; keep the result of this process's rank.
      const int me = test::process_rank();
      run_threads(4, [&](ThreadComm& c) {
        auto r = reductions<T>(c, count, op, salt);
        if (c.rank() == me) threads = std::move(r);
      });
      CHECK(bitwise_equal(mpi.first, threads.first));
      CHECK(bitwise_equal(mpi.second, threads.second));
    }
  }
  // The comparison can fail: summed in reverse rank order, these values differ in the bits.
  if constexpr (std::is_same_v<T, float>) {
    int differ = 0;
    for (std::size_t i = 0; i < 1001; ++i) {
      float fwd = spread_value<float>(0, i, 7), back = spread_value<float>(3, i, 7);
      for (int r = 1; r < 4; ++r) fwd += spread_value<float>(r, i, 7);
      for (int r = 2; r >= 0; --r) back += spread_value<float>(r, i, 7);
      differ += fwd != back;
    }
    CHECK(differ > 0);
  }
}

TEST_CASE("MPI: a rank that stalls past the deadline is named on every process at the deadline") {
  REQUIRE(test::processes() == 4);
  const auto d = 300ms;
  double earliest = 1e9, worst = 0;
  for (int iter = 0; iter < 20; ++iter) {
    auto [out, top] = test::run_faulty(4, d, [&](test::World& c, Clock::time_point& start) {
      std::vector<double> v(64, 1.0);
      c.all_reduce(std::span<double>(v));
      start = Clock::now();
      if (c.rank() == 1) std::this_thread::sleep_for(2 * d);  // misses all_reduce #2's deadline
      c.all_reduce(std::span<double>(v));
    });
    REQUIRE(out.size() == 1);
    const test::Outcome& o = out[0];
    CHECK(o.weft_error);
    CHECK(top.find("run_threads: world rank ") == 0);
    if (o.rank == 1) {  // the stalled rank learns of it when it wakes
      CHECK_MESSAGE(
          o.message.find("gave up waiting for world rank 1 in all_reduce #2 on world{0,1,2,3} (deadline 300 ms)") !=
              std::string::npos,
          o.message);
      continue;
    }
    CHECK_MESSAGE(
        o.message.find("world rank 1 did not reach all_reduce #2 on world{0,1,2,3} within the 300 ms deadline") !=
            std::string::npos,
        o.message);
    earliest = std::min(earliest, o.seconds);
    worst = std::max(worst, o.seconds);
    // The deadline, then a grace of min(deadline, 1 s) for the other ranks' notices (mpi/world.hpp).
    CHECK(o.seconds < 0.3 + 0.3 + test::kSchedulingMargin);
  }
  if (!test::holds_rank(1)) {
    CHECK(earliest >= 0.29);  // nobody gave up before the deadline
    MESSAGE("stall: this process raised its Error after ", earliest, " to ", worst, " s (deadline 0.3 s)");
  }
}

TEST_CASE("MPI: a rank that throws: every other process raises Error naming it the op and its number at once") {
  REQUIRE(test::processes() == 4);
  double worst = 0;
  for (int iter = 0; iter < 20; ++iter) {
    auto [out, top] = test::run_faulty(4, 60s, [](test::World& c, Clock::time_point& start) {
      std::vector<float> v(100, 1.0f);
      c.all_reduce(std::span<float>(v));
      c.all_reduce(std::span<float>(v));
      start = Clock::now();
      if (c.rank() == 2) throw std::runtime_error("boom in the forward pass");
      c.all_reduce(std::span<float>(v));  // #3
    });
    REQUIRE(out.size() == 1);
    const test::Outcome& o = out[0];
    if (o.rank == 2) continue;
    CHECK(o.weft_error);
    CHECK_MESSAGE(o.message.find("all_reduce #3 on world{0,1,2,3}") != std::string::npos, o.message);
    CHECK_MESSAGE(o.message.find("aborted because world rank 2 failed: boom in the forward pass") != std::string::npos,
                  o.message);
    worst = std::max(worst, o.seconds);
    CHECK(o.seconds < test::kSchedulingMargin);  // at once: the 60 s deadline is not waited for
    CHECK(top ==
          "run_threads: world rank 2 failed: boom in the forward pass; fix the first failure; the other ranks "
          "stopped because of it");
  }
  if (!test::holds_rank(2)) MESSAGE("throw: this process raised its Error after at most ", worst, " s");
}

TEST_CASE("MPI: sends in flight to one peer arrive in the order they were posted") {
  test::run_ranks(2, [](test::World& c) {
    std::vector<std::vector<float>> msgs;
    for (int k = 0; k < 5; ++k) msgs.emplace_back(static_cast<std::size_t>(10 + k), static_cast<float>(k));
    if (c.rank() == 0) {
      std::vector<test::World::SendHandle> sent;
      for (const auto& m : msgs) sent.push_back(c.isend(std::span<const float>(m), 1));
      for (const auto& h : sent) c.wait(h);
      CHECK(c.counters().calls_of(threads::Op::send) == 5);
    } else {
      for (int k = 0; k < 5; ++k) {
        std::vector<float> got(static_cast<std::size_t>(10 + k));
        c.recv(std::span<float>(got), 0);
        CHECK(got == msgs[static_cast<std::size_t>(k)]);
      }
    }
  });
}
