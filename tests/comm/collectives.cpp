// Every collective (all_to_all_v with counts that differ by pair, some zero) for 1 to 8 ranks, several sizes and every
// element type, against a serial reference computed from the same inputs in rank order: on threads, and (built with
// WEFT_TEST_MPI, as comm_mpi) on the MPI processes of mpirun -np 4, up to 4 ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "support/ranks.hpp"
#include "weft/comm/threads/memory.hpp"
#include "weft/core/philox.hpp"

using namespace weft;

namespace {

// Input element i of rank r: small integers, so integer sums are exact and float sums too (f32:
// |x| <= 64 and 8 addends stay far below 2^24; bf16: values are exactly representable, and sums
// round once from the float accumulation).
template <class T>
T value(int rank, std::int64_t i, std::uint64_t salt) {
  const auto w = philox(salt, static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(i))[0];
  const double v = static_cast<double>(static_cast<int>(w % 129) - 64) / (std::is_integral_v<T> ? 1.0 : 4.0);
  if constexpr (std::is_same_v<T, bf16>) return bf16(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <class T>
double as_double(T x) {
  if constexpr (std::is_same_v<T, bf16>) return static_cast<float>(x);
  else return static_cast<double>(x);
}

// The serial reference of a sum or max in rank order, rounded like the back end (bf16: once).
template <class T>
T reference(int n, std::int64_t i, std::uint64_t salt, ReduceOp op) {
  using A = accumulate_t<T>;
  A acc = widen(value<T>(0, i, salt));
  for (int r = 1; r < n; ++r) {
    const A v = widen(value<T>(r, i, salt));
    acc = op == ReduceOp::sum ? A(acc + v) : std::max(acc, v);
  }
  return narrow<T>(acc);
}

template <class T>
bool same(T a, T b) {
  return as_double(a) == as_double(b);
}

const std::int64_t kCounts[] = {1, 7, 64, 1000, 4099};

template <class T>
void check_reductions_and_moves(int n) {
  std::mutex mu;
  std::vector<std::string> errors;
  auto fail = [&](std::string s) {
    std::lock_guard lock(mu);
    errors.push_back(std::move(s));
  };
  test::run_ranks(n, [&](test::World& c) {
    const int me = c.rank();
    std::uint64_t salt = 0;
    for (const std::int64_t count : kCounts) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        ++salt;
        std::vector<T> buf(static_cast<std::size_t>(count));
        for (std::int64_t i = 0; i < count; ++i) buf[static_cast<std::size_t>(i)] = value<T>(me, i, salt);
        c.all_reduce(std::span<T>(buf), op);
        for (std::int64_t i = 0; i < count; ++i)
          if (!same(buf[static_cast<std::size_t>(i)], reference<T>(n, i, salt, op))) {
            fail(cat("all_reduce ", name(op), " count ", count, " at ", i));
            break;
          }

        // reduce_scatter: `count` elements per rank.
        ++salt;
        std::vector<T> in(static_cast<std::size_t>(count * n)), out(static_cast<std::size_t>(count));
        for (std::int64_t i = 0; i < count * n; ++i) in[static_cast<std::size_t>(i)] = value<T>(me, i, salt);
        c.reduce_scatter(std::span<const T>(in), std::span<T>(out), op);
        for (std::int64_t i = 0; i < count; ++i)
          if (!same(out[static_cast<std::size_t>(i)], reference<T>(n, me * count + i, salt, op))) {
            fail(cat("reduce_scatter ", name(op), " count ", count, " at ", i));
            break;
          }
      }
      // all_gather: chunk r of the output is rank r's input.
      ++salt;
      std::vector<T> in(static_cast<std::size_t>(count)), out(static_cast<std::size_t>(count * n));
      for (std::int64_t i = 0; i < count; ++i) in[static_cast<std::size_t>(i)] = value<T>(me, i, salt);
      c.all_gather(std::span<const T>(in), std::span<T>(out));
      for (int r = 0; r < n; ++r)
        for (std::int64_t i = 0; i < count; ++i)
          if (!same(out[static_cast<std::size_t>(r * count + i)], value<T>(r, i, salt))) {
            fail(cat("all_gather count ", count, " rank ", r, " at ", i));
            r = n;
            break;
          }
      // all_to_all: out chunk r is chunk `me` of rank r's input.
      ++salt;
      std::vector<T> a(static_cast<std::size_t>(count * n)), b(static_cast<std::size_t>(count * n));
      for (std::int64_t i = 0; i < count * n; ++i) a[static_cast<std::size_t>(i)] = value<T>(me, i, salt);
      c.all_to_all(std::span<const T>(a), std::span<T>(b));
      for (int r = 0; r < n; ++r)
        for (std::int64_t i = 0; i < count; ++i)
          if (!same(b[static_cast<std::size_t>(r * count + i)], value<T>(r, me * count + i, salt))) {
            fail(cat("all_to_all count ", count, " from rank ", r, " at ", i));
            r = n;
            break;
          }
      // all_to_all_v: rank s sends rank r sent(s, r) elements (some none), its runs in rank order;
      // out's run from rank s is that run of s's input.
      ++salt;
      const auto sent = [&](int s, int r) { return (count + 3 * s + 5 * r) % (count + 2); };
      std::vector<std::int64_t> to(static_cast<std::size_t>(n)), from(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        to[static_cast<std::size_t>(r)] = sent(me, r);
        from[static_cast<std::size_t>(r)] = sent(r, me);
      }
      std::int64_t total_in = 0, total_out = 0;
      for (int r = 0; r < n; ++r) total_in += sent(me, r), total_out += sent(r, me);
      std::vector<T> va(static_cast<std::size_t>(total_in)), vb(static_cast<std::size_t>(total_out));
      for (std::int64_t i = 0; i < total_in; ++i) va[static_cast<std::size_t>(i)] = value<T>(me, i, salt);
      c.all_to_all_v(std::span<const T>(va), std::span<const std::int64_t>(to), std::span<T>(vb),
                     std::span<const std::int64_t>(from));
      for (std::int64_t at = 0, s = 0; s < n; ++s) {
        std::int64_t first = 0;  // where s's run for me starts in its input
        for (int r = 0; r < me; ++r) first += sent(static_cast<int>(s), r);
        for (std::int64_t i = 0; i < sent(static_cast<int>(s), me); ++i, ++at)
          if (!same(vb[static_cast<std::size_t>(at)], value<T>(static_cast<int>(s), first + i, salt))) {
            fail(cat("all_to_all_v count ", count, " from rank ", s, " at ", i));
            s = n;
            break;
          }
      }
      // broadcast from the last rank.
      ++salt;
      std::vector<T> bc(static_cast<std::size_t>(count));
      for (std::int64_t i = 0; i < count; ++i) bc[static_cast<std::size_t>(i)] = value<T>(me, i, salt);
      c.broadcast(std::span<T>(bc), n - 1);
      for (std::int64_t i = 0; i < count; ++i)
        if (!same(bc[static_cast<std::size_t>(i)], value<T>(n - 1, i, salt))) {
          fail(cat("broadcast count ", count, " at ", i));
          break;
        }
    }
  });
  CHECK_MESSAGE(errors.empty(), n, " ranks, ", name(dtype_of<T>), ": ", join(errors, "; "));
}

}  // namespace

TEST_CASE_TEMPLATE("collectives match the serial reference on 1 to 8 ranks", T, float, double, bf16, std::int32_t,
                   std::int64_t) {
  for (int n = 1; n <= 8; ++n)
    if (test::runs(n)) check_reductions_and_moves<T>(n);
}

#ifndef WEFT_TEST_MPI  // 8 and 6 ranks, results gathered across ranks in one process
TEST_CASE_TEMPLATE("all_reduce of slices of several chunks (each rank passes on 64 KiB at a time)", T, float, double,
                   bf16) {
  // 9 chunks and a few elements in all (threads::Memory::chunk_bytes of host memory, 64 KiB, read
  // from it so that the test follows a change): on 2 to 4 ranks each rank's slice is more than 2
  // chunks, and no slice ends on a chunk boundary.
  const auto chunk = static_cast<std::int64_t>(threads::Memory{}.chunk_bytes(nullptr) / sizeof(T));
  const std::int64_t count = 9 * chunk + 7;
  for (int n = 2; n <= 4; ++n) {
    if (!test::runs(n)) continue;
    REQUIRE(count / n > 2 * chunk);
    std::vector<int> wrong(static_cast<std::size_t>(n), 0);
    test::run_ranks(n, [&](test::World& c) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        std::vector<T> buf(static_cast<std::size_t>(count));
        for (std::int64_t i = 0; i < count; ++i) buf[static_cast<std::size_t>(i)] = value<T>(c.rank(), i, 99);
        c.all_reduce(std::span<T>(buf), op);
        for (std::int64_t i = 0; i < count; ++i)
          wrong[static_cast<std::size_t>(c.rank())] +=
              !same(buf[static_cast<std::size_t>(i)], reference<T>(n, i, 99, op));
      }
    });
    CHECK_MESSAGE(wrong == std::vector<int>(static_cast<std::size_t>(n), 0), n, " ranks");
  }
}

TEST_CASE("all_reduce of bf16 accumulates in float and rounds once") {
  // Rank 0 holds 1, ranks 1..7 hold 2^-9 (a quarter of bf16's spacing at 1). Added in bf16 every
  // partial sum would round back to 1; accumulated in float the sum is 1 + 7 2^-9, which rounds
  // once to 1 + 2^-6.
  run_threads(8, [](ThreadComm& c) {
    std::vector<bf16> v{bf16(c.rank() == 0 ? 1.0f : 0x1.0p-9f)};
    c.all_reduce(std::span<bf16>(v));
    CHECK(static_cast<float>(v[0]) == 1.0f + 0x1.0p-6f);
  });
}

TEST_CASE("reductions are bitwise identical across ranks and runs (fixed rank order)") {
  // Values of very different magnitude make the float sum order-dependent, so a change of order
  // would show up in the bits.
  std::vector<std::vector<float>> runs;
  std::mutex mu;
  for (int run = 0; run < 5; ++run) {
    run_threads(6, [&](ThreadComm& c) {
      std::vector<float> v(1001);
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] =
            static_cast<float>(normal(9, static_cast<std::uint64_t>(c.rank()), i) * std::pow(10.0, (c.rank() * 3) % 7));
      c.all_reduce(std::span<float>(v));
      std::lock_guard lock(mu);
      runs.push_back(v);
    });
  }
  REQUIRE(runs.size() == 30);
  for (const auto& r : runs) CHECK(std::memcmp(r.data(), runs[0].data(), r.size() * sizeof(float)) == 0);
  // And the order is 0, 1, ..., n-1: recompute element 0 serially.
  float expect = 0;
  for (int r = 0; r < 6; ++r) {
    const float x = static_cast<float>(normal(9, static_cast<std::uint64_t>(r), 0) * std::pow(10.0, (r * 3) % 7));
    expect = r == 0 ? x : expect + x;
  }
  CHECK(runs[0][0] == expect);
}
#endif

TEST_CASE("send and recv move buffers between ranks in order") {
  test::run_ranks(4, [](test::World& c) {
    const int me = c.rank(), n = c.size();
    // A ring: even ranks send first, odd ranks receive first (synchronous sends need the order).
    std::vector<double> out(37), in(37);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = me * 1000.0 + static_cast<double>(i);
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    for (int round = 0; round < 3; ++round) {
      if (me % 2 == 0) {
        c.send(std::span<const double>(out), next);
        c.recv(std::span<double>(in), prev);
      } else {
        c.recv(std::span<double>(in), prev);
        c.send(std::span<const double>(out), next);
      }
      for (std::size_t i = 0; i < in.size(); ++i) REQUIRE(in[i] == prev * 1000.0 + static_cast<double>(i));
    }
  });
}

TEST_CASE("split forms groups by color ordered by key") {
  test::run_ranks(4, [](test::World& c) {
    // Colors by parity; keys reverse the order.
    test::World g = c.split(c.rank() % 2, -c.rank(), "parity");
    CHECK(g.size() == 2);
    const std::vector<int> expect = c.rank() % 2 ? std::vector<int>{3, 1} : std::vector<int>{2, 0};
    CHECK(g.members() == expect);
    CHECK(g.name() == (c.rank() % 2 ? "parity{3,1}" : "parity{2,0}"));
    // A sum over the group adds exactly its members' world ranks.
    std::vector<std::int32_t> v{c.rank()};
    g.all_reduce(std::span<std::int32_t>(v));
    CHECK(v[0] == (c.rank() % 2 ? 4 : 2));
  });
}
