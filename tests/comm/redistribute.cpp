// redistribute for every (From, To) pair of layouts over {Replicate, Shard<0>, Shard<-1>, Partial}
// on both axes, on meshes of 1, 2 and 4 ranks: exact results, exact round trips, and the adjoint
// identity. Ranks are threads, or (built with WEFT_TEST_MPI, as comm_mpi) MPI processes.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <mutex>

#include "support/error.hpp"
#include "support/layouts.hpp"
#include "support/ranks.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/redistribute.hpp"
#include "weft/device/host/host.hpp"

using namespace weft;
using test::List;

namespace {

using R = Replicate;
using P = Partial;
using S0 = Shard<0>;
using SL = Shard<-1>;  // the last dim of a rank-3 tensor: outer extent > 1, so collectives pack

// The 14 valid layouts (both axes sharding dim 0 or dim -1 is not a layout).
using Layouts = List<Layout<R, R>, Layout<R, S0>, Layout<R, SL>, Layout<R, P>,  //
                     Layout<S0, R>, Layout<S0, SL>, Layout<S0, P>,              //
                     Layout<SL, R>, Layout<SL, S0>, Layout<SL, P>,              //
                     Layout<P, R>, Layout<P, S0>, Layout<P, SL>, Layout<P, P>>;

template <class F, class... Ls>
void for_each(List<Ls...>, F&& f) {
  (f.template operator()<Ls>(), ...);
}

template <class From, class To>
constexpr bool forward_ok = Transition<From, To>::possible && !Transition<From, To>::uses_embed;

const Shape kGlobal{4, 3, 8};  // divisible by 4 on dims 0 and 2

struct Meshes {
  int data, tensor;
};
constexpr Meshes kMeshes[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}};

std::vector<double> global_values(std::uint64_t seed) {
  std::vector<double> X(static_cast<std::size_t>(kGlobal.numel()));
  for (std::size_t g = 0; g < X.size(); ++g) X[g] = test::dyadic(seed, 0, g);
  return X;
}

// Whether y, redistributed from the global tensor X, holds X: its local shape, every rank's part
// summed at its global positions (X times the replica count; collective over the world), and, with
// no Partial axis, each rank's part equal to X at its positions.
template <class To, class W>
bool holds_global(const Tensor<double, To, Host>& y, const std::vector<double>& X, const Spread& s, W& world) {
  std::vector<double> local(X.size(), 0.0);
  test::accumulate_global(y, local);
  world.all_reduce(std::span<double>(local));
  const double copies = test::replicas<To>(s);
  bool ok = y.local_shape() == local_shape<To>(kGlobal, s);
  for (std::size_t g = 0; g < X.size(); ++g) ok = ok && local[g] == X[g] * copies;
  if constexpr (!has_partial<To>)
    for (std::int64_t i = 0; i < y.numel(); ++i) ok = ok && y[i] == X[static_cast<std::size_t>(y.global_index(i))];
  return ok;
}

}  // namespace

TEST_CASE("redistribute: every (From To) pair gives the same global tensor exactly") {
  for (const auto m : kMeshes) {
    CAPTURE(m.data);
    CAPTURE(m.tensor);
    std::atomic<int> pairs{0};
    std::mutex mu;
    std::vector<std::string> failures;
    test::run_ranks(m.data * m.tensor, [&](test::World& world) {
      Mesh mesh{world, {.data = m.data, .tensor = m.tensor}};
      Host host;
      const Spread s = mesh.spread();
      const std::vector<double> X = global_values(7);
      for_each(Layouts{}, [&]<class From>() {
        for_each(Layouts{}, [&]<class To>() {
          if constexpr (forward_ok<From, To>) {
            const auto x = test::distribute<From>(host, X, kGlobal, s);
            const auto y = redistribute<To>(x, mesh);
            if (!holds_global(y, X, s, world)) {
              std::lock_guard lock(mu);
              failures.push_back(From::name() + " -> " + To::name());
            }
            if (world.rank() == 0) ++pairs;  // on the process that holds rank 0
          }
        });
      });
    });
    CHECK_MESSAGE(failures.empty(), "wrong results for ", join(failures, "; "));
    // 14 x 14 = 196 pairs, less 46 that take Shard -> Partial on an axis and 2 with no valid order
    // (<S0, S-1> <-> <S-1, S0>), counted by hand from the rules in transition.hpp.
    CHECK(pairs.load() == (test::holds_rank(0) ? 148 : 0));
  }
}

TEST_CASE("redistribute: Shard -> Replicate -> Shard round trips are bitwise exact") {
  for (const auto m : kMeshes) {
    test::run_ranks(m.data * m.tensor, [&](test::World& world) {
      Mesh mesh{world, {.data = m.data, .tensor = m.tensor}};
      Host host;
      std::vector<double> X(static_cast<std::size_t>(kGlobal.numel()));
      for (std::size_t g = 0; g < X.size(); ++g) X[g] = weft::normal(3, 1, g);  // full-precision values
      const auto x = test::distribute<Layout<S0, SL>>(host, X, kGlobal, mesh.spread());
      const auto back = redistribute<Layout<S0, SL>>(redistribute<Replicated>(x, mesh), mesh);
      const auto via = redistribute<Layout<S0, SL>>(redistribute<Layout<SL, R>>(x, mesh), mesh);
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        REQUIRE(back[i] == x[i]);
        REQUIRE(via[i] == x[i]);
      }
    });
  }
}

TEST_CASE("redistribute_adjoint: sum_r <redistribute(x) y> == sum_r <x adjoint(y)> within 1e-12") {
  for (const auto m : kMeshes) {
    std::atomic<int> pairs{0};
    std::mutex mu;
    double worst = 0;
    test::run_ranks(m.data * m.tensor, [&](test::World& world) {
      Mesh mesh{world, {.data = m.data, .tensor = m.tensor}};
      Host host;
      const Spread s = mesh.spread();
      std::uint64_t salt = 0;
      for_each(Layouts{}, [&]<class From>() {
        for_each(Layouts{}, [&]<class To>() {
          if constexpr (forward_ok<From, To>) {
            // Arbitrary per-rank buffers (replicas need not agree): the identity is about the
            // linear maps on the stacked local buffers.
            ++salt;
            auto x = Tensor<double, From, Host>::empty(host, kGlobal, s);
            auto y = Tensor<double, dual_layout<To>, Host>::empty(host, kGlobal, s);
            for (std::int64_t i = 0; i < x.numel(); ++i)
              x[i] = weft::normal(salt, static_cast<std::uint64_t>(world.rank()), static_cast<std::uint64_t>(i));
            for (std::int64_t i = 0; i < y.numel(); ++i)
              y[i] = weft::normal(salt, 1000 + static_cast<std::uint64_t>(world.rank()), static_cast<std::uint64_t>(i));
            const auto ax = redistribute<To>(x, mesh);
            const auto aty = redistribute_adjoint<From, To>(y, mesh);
            double dots[3] = {0, 0, 0};  // <Ax, y>, <x, A^T y>, scale
            for (std::int64_t i = 0; i < y.numel(); ++i) dots[0] += ax[i] * y[i];
            for (std::int64_t i = 0; i < x.numel(); ++i) dots[1] += x[i] * aty[i];
            for (std::int64_t i = 0; i < y.numel(); ++i) dots[2] += std::fabs(ax[i] * y[i]);
            world.all_reduce(std::span<double>(dots));
            // Relative to the sum of |terms|: the two sides add the same products in different orders.
            const double err = std::fabs(dots[0] - dots[1]) / dots[2];
            std::lock_guard lock(mu);
            worst = test::worse(worst, err);
            if (world.rank() == 0) ++pairs;  // on the process that holds rank 0
          }
        });
      });
    });
    CHECK(pairs.load() == (test::holds_rank(0) ? 148 : 0));
    CHECK(worst <= 1e-12);
    MESSAGE("mesh data ", m.data, " x tensor ", m.tensor, ": worst adjoint relative error ", worst);
  }
}

namespace {
// The communicator op that carries a communicating step.
threads::Op op_of(Collective c) {
  switch (c) {
    case Collective::all_gather: return threads::Op::all_gather;
    case Collective::all_to_all: return threads::Op::all_to_all;
    case Collective::all_reduce: return threads::Op::all_reduce;
    default: return threads::Op::reduce_scatter;
  }
}
}  // namespace

TEST_CASE("redistribute runs exactly the collectives of its plan with the planned bytes") {
  std::mutex mu;
  std::vector<std::string> failures;
  int pairs = 0;
  test::run_ranks(4, [&](test::World& world) {
    Mesh mesh{world, {.data = 2, .tensor = 2}};
    Host host;
    const Spread s = mesh.spread();
    for_each(Layouts{}, [&]<class From>() {
      for_each(Layouts{}, [&]<class To>() {
        if constexpr (forward_ok<From, To>) {
          const auto x = Tensor<double, From, Host>::zeros(host, kGlobal, s);
          const threads::Counters d0 = mesh.data().counters(), t0 = mesh.tensor().counters();
          const auto y = redistribute<To>(x, mesh);
          const threads::Counters ran[2] = {mesh.data().counters() - d0, mesh.tensor().counters() - t0};
          // Expected: one call per communicating step on its axis, with the planned buffer bytes.
          threads::Counters want[2];
          for (const CommStep& st : redistribution<From, To>(kGlobal, s, sizeof(double))) {
            if (!communicates(st.collective)) continue;
            auto& w = want[st.axis == Axis::data ? 0 : 1];
            const auto op = static_cast<std::size_t>(op_of(st.collective));
            w.calls[op] += 1;
            w.bytes[op] +=
                static_cast<std::uint64_t>(st.collective == Collective::all_gather ? st.bytes_out : st.bytes_in);
          }
          if (ran[0].calls != want[0].calls || ran[0].bytes != want[0].bytes || ran[1].calls != want[1].calls ||
              ran[1].bytes != want[1].bytes) {
            std::lock_guard lock(mu);
            failures.push_back(From::name() + " -> " + To::name());
          }
          if (world.rank() == 0) {
            std::lock_guard lock(mu);
            ++pairs;
          }
        }
      });
    });
  });
  CHECK(pairs == (test::holds_rank(0) ? 148 : 0));
  CHECK_MESSAGE(failures.empty(), "collectives differ from the plan for ", join(failures, "; "));
}

TEST_CASE_TEMPLATE("redistribute moves f32 and bf16 tensors too", E, float, bf16) {
  // Gather and reduce-scatter of small integers: exact in both types (bf16 holds integers up to 256).
  test::run_ranks(4, [](test::World& world) {
    Mesh mesh{world, {.data = 2, .tensor = 2}};
    Host host;
    auto x = Tensor<E, Layout<Shard<0>, Shard<-1>>, Host>::empty(host, {4, 6}, mesh.spread());
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = E(static_cast<float>(x.global_index(i)));
    const auto full = redistribute<Replicated>(x, mesh);
    for (std::int64_t i = 0; i < full.numel(); ++i) REQUIRE(static_cast<float>(full[i]) == static_cast<float>(i));
    // Every rank holds the full tensor as a Partial addend: the reduce-scatter sums 4 copies.
    const auto p =
        Tensor<E, Layout<Partial, Partial>, Host>::view(host, const_cast<E*>(full.data()), {4, 6}, mesh.spread());
    const auto s = redistribute<Layout<Shard<-1>, Shard<0>>>(p, mesh);
    for (std::int64_t i = 0; i < s.numel(); ++i)
      REQUIRE(static_cast<float>(s[i]) == 4.0f * static_cast<float>(s.global_index(i)));
  });
}

TEST_CASE("redistribute refuses a tensor whose spread does not match the mesh's groups, naming both degrees") {
  test::run_ranks(4, [](test::World& world) {
    Mesh mesh{world, {.tensor = 4}};
    Host h;
    // Cut for a tensor degree of 2, but the mesh's tensor group has 4 ranks: the all-gather would
    // assemble 4 shards of a tensor split in 2.
    auto x = Tensor<double, TensorSharded<0>, Host>::zeros(h, {8, 2},
                                                           {.tensor_degree = 2, .tensor_index = world.rank() % 2});
    CHECK_THROWS_WITH_AS(
        redistribute<Replicated>(x, mesh),
        "redistribute: the tensor's spread has tensor degree 2 but the mesh's tensor group has 4 ranks; "
        "build the tensor with the spread of the mesh it is redistributed on (mesh.spread())",
        Error);
  });
}

TEST_CASE("redistribute over three axes: a tensor sharded over pipe and tensor gathers and slices back exactly") {
  // data 1 x pipe 2 x tensor 2: (8, 6) sharded dim 0 over tensor and dim 1 over pipe.
  using Spread2 = Layout<Replicate, Shard<0>, Shard<1>>;
  using Whole = Layout<Replicate, Replicate, Replicate>;
  test::run_ranks(4, [](test::World& world) {
    Mesh mesh{world, {.pipe = 2, .tensor = 2}};
    Host h;
    auto x = Tensor<double, Spread2, Host>::empty(h, {8, 6}, mesh.spread());
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<double>(x.global_index(i));
    const auto c0 = mesh.pipe().counters();
    const auto whole = redistribute<Whole>(x, mesh);
    CHECK((mesh.pipe().counters() - c0).calls_of(threads::Op::all_gather) == 1);
    for (std::int64_t i = 0; i < whole.numel(); ++i) REQUIRE(whole[i] == static_cast<double>(i));
    const auto back = redistribute<Spread2>(whole, mesh);
    for (std::int64_t i = 0; i < back.numel(); ++i) REQUIRE(back[i] == x[i]);
  });
}

TEST_CASE(
    "redistribute over the context axis: every pair of context and tensor placements gives the same global tensor") {
  // Placements on context (dim 0, dim -1, Replicate, Partial) against the tensor and data axes;
  // StageLocal on pipe as ever.
  using SLoc = StageLocal;
  using Ctx = List<Layout<R, R, SLoc, R>, Layout<R, R, SLoc, S0>, Layout<R, R, SLoc, SL>, Layout<R, R, SLoc, P>,
                   Layout<R, S0, SLoc, SL>, Layout<R, SL, SLoc, S0>, Layout<R, P, SLoc, S0>, Layout<R, S0, SLoc, P>,
                   Layout<S0, R, SLoc, SL>, Layout<P, R, SLoc, P>, Layout<SL, P, SLoc, S0>>;
  struct Shape3 {
    int data, context, tensor;
  };
  for (const auto m : {Shape3{1, 2, 1}, Shape3{1, 4, 1}, Shape3{1, 2, 2}, Shape3{2, 2, 1}}) {
    CAPTURE(m.data);
    CAPTURE(m.context);
    CAPTURE(m.tensor);
    std::atomic<int> pairs{0}, context_calls{0};
    std::mutex mu;
    std::vector<std::string> failures;
    test::run_ranks(m.data * m.context * m.tensor, [&](test::World& world) {
      Mesh mesh{world, {.data = m.data, .context = m.context, .tensor = m.tensor}};
      Host host;
      const Spread s = mesh.spread();
      const std::vector<double> X = global_values(11);
      for_each(Ctx{}, [&]<class From>() {
        for_each(Ctx{}, [&]<class To>() {
          if constexpr (forward_ok<From, To>) {
            const auto x = test::distribute<From>(host, X, kGlobal, s);
            const threads::Counters before = mesh.context().counters();
            const auto y = redistribute<To>(x, mesh);
            const threads::Counters ran = mesh.context().counters() - before;
            bool ok = holds_global(y, X, s, world);
            // The context group runs the plan's context step, if it communicates, with its bytes.
            threads::Counters want;
            for (const CommStep& st : redistribution<From, To>(kGlobal, s, sizeof(double)))
              if (st.axis == Axis::context && communicates(st.collective)) {
                const auto op = static_cast<std::size_t>(op_of(st.collective));
                want.calls[op] += 1;
                want.bytes[op] +=
                    static_cast<std::uint64_t>(st.collective == Collective::all_gather ? st.bytes_out : st.bytes_in);
              }
            ok = ok && ran.calls == want.calls && ran.bytes == want.bytes;
            if (!ok) {
              std::lock_guard lock(mu);
              failures.push_back(From::name() + " -> " + To::name());
            }
            if (world.rank() == 0) {
              ++pairs;
              for (auto n : ran.calls) context_calls += static_cast<int>(n);
            }
          }
        });
      });
    });
    CHECK_MESSAGE(failures.empty(), "wrong results for ", join(failures, "; "));
    // 11 x 11 pairs less those that take Shard -> Partial on an axis or find no valid order; at
    // least one collective on the context group in all.
    if (test::holds_rank(0)) {
      CHECK(pairs.load() > 60);
      CHECK(context_calls.load() > 0);
    }
  }
}
