// train::StopPoints and train::Polling (train/stop.hpp): which points of a step poll, from the
// previous step's time and point count (closed forms); and on thread ranks whose stop flags differ,
// every rank throws Abandoned at the same point, the first polled one after any flag is set, with
// the largest signal, having run the work before it; the communicator is usable afterwards (a
// checkpoint's collectives follow an abandoned step).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "weft/comm/threads/run.hpp"
#include "weft/train/stop.hpp"

using namespace weft;

namespace {

// Counts the work run between the points.
struct Recording {
  std::int64_t acquires = 0, releases = 0;
  void acquire() { ++acquires; }
  void release() { ++releases; }
};

std::vector<std::int64_t> due_points(train::StopPoints& p, std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t i = 1; i <= n; ++i)
    if (p.due()) out.push_back(i);
  return out;
}

}  // namespace

TEST_CASE("train::StopPoints: spaced about `every` seconds apart by the previous step") {
  train::StopPoints p(0.25);
  SUBCASE("nothing measured yet (the first step): every point polls") {
    p.begin_step(-1, 0);
    CHECK(due_points(p, 5) == std::vector<std::int64_t>{1, 2, 3, 4, 5});
    CHECK(p.counted() == 5);
  }
  SUBCASE("a step under 2 x every finishes before it matters: no point polls") {
    p.begin_step(0.49, 1000);
    CHECK(p.spacing() == train::StopPoints::kNever);
    CHECK(due_points(p, 2000).empty());
  }
  SUBCASE("10 s over 100 points: 0.1 s a point, every 2nd polls") {
    p.begin_step(10, 100);
    CHECK(p.spacing() == 2);
    CHECK(due_points(p, 7) == std::vector<std::int64_t>{2, 4, 6});
  }
  SUBCASE("1 s over 1000 points: 1 ms a point, every 250th polls") {
    p.begin_step(1.0, 1000);
    CHECK(p.spacing() == 250);
    CHECK(due_points(p, 1000) == std::vector<std::int64_t>{250, 500, 750, 1000});
  }
  SUBCASE("points longer than `every`: each polls") {
    p.begin_step(100, 10);
    CHECK(p.spacing() == 1);
    p.begin_step(0.6, 2);  // 0.3 s a point
    CHECK(p.spacing() == 1);
  }
  SUBCASE("begin_step restarts the count") {
    p.begin_step(10, 100);
    (void)due_points(p, 3);
    p.begin_step(10, 100);
    CHECK(p.counted() == 0);
    CHECK(due_points(p, 2) == std::vector<std::int64_t>{2});
  }
}

TEST_CASE("train::Polling: every rank abandons at the same point, with the largest signal") {
  constexpr int ranks = 3;
  // Rank 1 sees signal 15 before its point 7, rank 2 signal 2 before its point 8; polls every
  // 3rd point (8 s over 100 points: 0.08 s a point, 0.25 s apart): all ranks stop at point 9,
  // none before.
  std::vector<std::int64_t> stopped_at(ranks, -1), forwarded(ranks, -1);
  std::vector<int> signal(ranks, 0), after(ranks, 0);
  run_threads(ranks, [&](ThreadComm& world) {
    const int r = world.rank();
    std::atomic<int> flag{0};
    train::StopPoints points(0.25);
    points.begin_step(8, 100);
    CHECK(points.spacing() == 3);
    Recording inner;
    train::Polling polling(world, flag, points);
    try {
      for (std::int64_t i = 1; i <= 30; ++i) {
        if (r == 1 && i == 7) flag = 15;
        if (r == 2 && i == 8) flag = 2;
        polling.point();
        inner.acquire();
        inner.release();
      }
    } catch (const train::Abandoned& a) {
      stopped_at[static_cast<std::size_t>(r)] = points.counted();
      signal[static_cast<std::size_t>(r)] = a.signal;
    }
    forwarded[static_cast<std::size_t>(r)] = inner.acquires;
    CHECK(inner.releases == inner.acquires);
    // The communicator goes on: one more collective after the abandoned step.
    std::int64_t one[1] = {1};
    world.all_reduce(std::span<std::int64_t>(one));
    after[static_cast<std::size_t>(r)] = static_cast<int>(one[0]);
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    CHECK(stopped_at[static_cast<std::size_t>(r)] == 9);
    CHECK(forwarded[static_cast<std::size_t>(r)] == 8);  // the polled point throws before the work after it
    CHECK(signal[static_cast<std::size_t>(r)] == 15);
    CHECK(after[static_cast<std::size_t>(r)] == ranks);
  }
}

TEST_CASE("train::Polling: no flag, or a short step, never abandons") {
  for (double previous : {-1.0, 0.1}) {
    CAPTURE(previous);
    std::vector<std::int64_t> forwarded(2, -1);
    run_threads(2, [&](ThreadComm& world) {
      std::atomic<int> flag{0};
      train::StopPoints points;
      points.begin_step(previous, 20);
      Recording inner;
      train::Polling polling(world, flag, points);
      for (int i = 0; i < 20; ++i) polling.point(), inner.acquire();
      if (previous > 0) flag = 2;  // set, but a short step is not polled: the step's end stops it
      for (int i = 0; i < 20; ++i) polling.point(), inner.acquire();
      forwarded[static_cast<std::size_t>(world.rank())] = inner.acquires;
    });
    CHECK(forwarded == std::vector<std::int64_t>{40, 40});
  }
}
