// Mismatched calls, on the thread back end and (built with WEFT_TEST_MPI) on MPI processes: every
// rank raises weft::Error naming every rank's call before any data moves. Each case runs 20 times.
#include <doctest/doctest.h>

#include <chrono>
#include <vector>

#include "support/ranks.hpp"

using namespace weft;
using namespace std::chrono_literals;
using test::Clock;
using test::Outcome;
using test::run_faulty;

TEST_CASE("mismatched collectives are reported on every rank before any data moves") {
  for (int iter = 0; iter < 20; ++iter) {
    // Different ops.
    auto [a, ta] = run_faulty(3, 60s, [](test::World& c, Clock::time_point&) {
      std::vector<float> in(8, 1.0f), out(24);
      if (c.rank() == 0) c.all_reduce(std::span<float>(in));
      else c.all_gather(std::span<const float>(in), std::span<float>(out));
    });
    REQUIRE(a.size() == static_cast<std::size_t>(test::local_ranks(3)));
    for (const Outcome& o : a) {
      CHECK(o.weft_error);
      CHECK_MESSAGE(o.message.find("mismatched collective #1 on world{0,1,2}: world rank 0 called all_reduce(f32, 8, "
                                   "sum), world rank 1 called all_gather(f32, in 8, out 24)") != std::string::npos,
                    o.message);
      CHECK(o.seconds < 1.0);
    }
    // Same op, different counts.
    auto [b, tb] = run_faulty(2, 60s, [](test::World& c, Clock::time_point&) {
      std::vector<double> v(c.rank() == 0 ? 10 : 11, 1.0);
      c.all_reduce(std::span<double>(v));
    });
    REQUIRE(b.size() == static_cast<std::size_t>(test::local_ranks(2)));
    for (const Outcome& o : b)
      CHECK_MESSAGE(o.message.find("world rank 0 called all_reduce(f64, 10, sum), world rank 1 called all_reduce(f64, "
                                   "11, sum)") != std::string::npos,
                    o.message);
    // Same op and count, different dtypes.
    auto [d, td] = run_faulty(2, 60s, [](test::World& c, Clock::time_point&) {
      if (c.rank() == 0) {
        std::vector<float> v(4);
        c.broadcast(std::span<float>(v), 0);
      } else {
        std::vector<std::int32_t> v(4);
        c.broadcast(std::span<std::int32_t>(v), 0);
      }
    });
    REQUIRE(d.size() == static_cast<std::size_t>(test::local_ranks(2)));
    for (const Outcome& o : d)
      CHECK_MESSAGE(o.message.find("broadcast(f32, 4, root 0), world rank 1 called broadcast(i32, 4, root 0)") !=
                        std::string::npos,
                    o.message);
    // A send whose recv expects another count: both ends raise.
    auto [e, te] = run_faulty(2, 60s, [](test::World& c, Clock::time_point&) {
      std::vector<float> v(c.rank() == 0 ? 5 : 6);
      if (c.rank() == 0) c.send(std::span<const float>(v), 1);
      else c.recv(std::span<float>(v), 0);
    });
    REQUIRE(e.size() == static_cast<std::size_t>(test::local_ranks(2)));
    for (const Outcome& o : e)
      CHECK_MESSAGE(o.message.find("group rank 0 sent 5 f32 but group rank 1 expected 6 f32") != std::string::npos,
                    o.message);
  }
}

#ifndef WEFT_TEST_MPI  // the thread back end sees every rank's counts; MPI and NCCL trust the caller's
TEST_CASE("an all_to_all_v whose pair of counts disagree is refused on every rank before any data moves") {
  auto [a, ta] = run_faulty(2, 60s, [](test::World& c, Clock::time_point&) {
    // Rank 0 sends rank 1 three elements; rank 1 expects two.
    const std::vector<std::int64_t> to =
        c.rank() == 0 ? std::vector<std::int64_t>{1, 3} : std::vector<std::int64_t>{2, 1};
    const std::vector<std::int64_t> from =
        c.rank() == 0 ? std::vector<std::int64_t>{1, 2} : std::vector<std::int64_t>{2, 1};
    std::vector<float> in(static_cast<std::size_t>(to[0] + to[1])), out(static_cast<std::size_t>(from[0] + from[1]));
    c.all_to_all_v(std::span<const float>(in), std::span<const std::int64_t>(to), std::span<float>(out),
                   std::span<const std::int64_t>(from));
  });
  REQUIRE(a.size() == 2);
  for (const Outcome& o : a) {
    CHECK(o.weft_error);
    CHECK_MESSAGE(o.message.find("mismatched all_to_all_v #1 on world{0,1}: world rank 0 sends 3 elements to world "
                                 "rank 1, which expects 2") != std::string::npos,
                  o.message);
  }
}
#endif
