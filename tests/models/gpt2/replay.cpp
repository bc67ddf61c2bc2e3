// footprint::step (the peaks of a training step by category) against the host allocator's peaks,
// measured over the same step on thread ranks: every data-parallel strategy, with and without
// sequence parallelism, every recompute policy, f32 and bf16 mixed precision, one and two
// micro-batches, local batches of one and of two sequences (the redistributions' scratch buffers
// differ). Exact: the replay counts the same buffers as the allocator, so any difference is a
// planning error (the target is 5%; a difference of one byte fails here).
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/core/float8_gemms.hpp"
#include "weft/device/host/host.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/models/gpt2/replay.hpp"
#include "weft/pipeline/executor.hpp"
#include "weft/pipeline/pipelined.hpp"

using namespace weft;

namespace {

struct Measured {
  std::array<std::int64_t, kCategories> peak{}, planned{}, after{}, planned_after{};
  std::int64_t total = 0, planned_total = 0;
  // What each of two steps allocated (bytes per category, blocks), and the plan's: a step
  // allocates nothing the plan does not call for, the first step and the steady one alike.
  std::array<std::array<std::int64_t, kCategories>, 2> allocated{};
  std::array<std::int64_t, 2> allocations{};
  std::array<std::int64_t, kCategories> planned_allocated{};
  std::int64_t planned_allocations = 0;
};

// Two steps on `host` (each `step()` a training step): what each allocated, and the first's peaks
// and what it left; then the plan's numbers for the same.
template <class Step>
void record(Measured& r, Host& host, Step&& step, const footprint::StepPeak& plan) {
  for (std::size_t s = 0; s < 2; ++s) {
    const MemoryStats before = host.memory();
    host.reset_peak();
    step();
    for (std::size_t k = 0; k < kCategories; ++k) r.allocated[s][k] = host.memory().allocated[k] - before.allocated[k];
    r.allocations[s] = host.memory().allocations - before.allocations;
    if (s > 0) continue;
    for (std::size_t k = 0; k < kCategories; ++k) {
      r.peak[k] = host.memory().peak[k];
      r.after[k] = host.memory().current[k];
    }
    r.total = host.memory().total_peak;
  }
  for (std::size_t k = 0; k < kCategories; ++k) {
    r.planned[k] = plan.peak.bytes[k];
    r.planned_after[k] = plan.after.bytes[k];
    r.planned_allocated[k] = plan.allocated.bytes[k];
  }
  r.planned_total = plan.total;
  r.planned_allocations = plan.allocations;
}

// Every rank's counts equal its plan's, category by category, to the byte.
void compare(const std::vector<Measured>& got, const std::string& what) {
  for (std::size_t rank = 0; rank < got.size(); ++rank) {
    const Measured& r = got[rank];
    INFO(what, " rank ", rank);
    for (std::size_t k = 0; k < kCategories; ++k) {
      INFO(std::string(name(static_cast<Category>(k))));
      CHECK(r.peak[k] == r.planned[k]);
      CHECK(r.after[k] == r.planned_after[k]);
      CHECK(r.allocated[0][k] == r.planned_allocated[k]);
      CHECK(r.allocated[1][k] == r.planned_allocated[k]);
    }
    CHECK(r.total == r.planned_total);
    CHECK(r.allocations[0] == r.planned_allocations);
    CHECK(r.allocations[1] == r.planned_allocations);
  }
}

// A data rank's tokens and targets: `micro` sequences over the data degree.
std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> tokens(const gpt2::Config& c, std::int64_t micro,
                                                                       int data, int data_index) {
  const std::int64_t n = micro / data * c.seq;
  std::vector<std::int32_t> x(static_cast<std::size_t>(n)), y(x.size());
  for (std::int64_t i = 0; i < n; ++i) {
    x[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + data_index) % c.vocab);
    y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 3 + 1) % c.vocab);
  }
  return {x, y};
}

template <class Strategy, class P, bool SP, class R = recompute::None>
void check(const gpt2::Config& c, MeshShape shape, std::int64_t micro, std::int64_t micro_batches = 1) {
  const int ranks = shape.data * shape.tensor;
  std::vector<Measured> got(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](ThreadComm& w) {
    Mesh mesh{w, shape};
    Host host;
    gpt2::Model<P, SP, R> gpt(host, c, mesh.spread(), micro);
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{}, mesh);
    const auto [x, y] = tokens(c, micro, shape.data, mesh.coord().data);
    record(
        got[static_cast<std::size_t>(w.rank())], host,
        [&] {
          for (std::int64_t m = 0; m < micro_batches; ++m) {
            auto ctx = gpt.in_flight({{x, y}, micro, 1.0 / static_cast<double>(micro_batches)});
            pipeline::forward_backward(gpt, ctx, mesh, dp, m + 1 == micro_batches);
          }
          dp.step(1e-3, 1.0);
        },
        footprint::step<Strategy, P, SP, R>(c, mesh.spread(), micro, micro_batches));
  });
  compare(got, cat(Strategy::name(), SP ? "-sp " : " ", precision_t<P>::name(), " data ", shape.data, " tensor ",
                   shape.tensor, " micro ", micro, " x ", micro_batches));
}

// Odd vocabulary (padded on the tensor axis), the sequence divisible by the tensor degree for SP.
constexpr gpt2::Config kSmall{.vocab = 37, .seq = 8, .layers = 2, .heads = 2, .width = 8};

template <class Strategy>
void check_strategy() {
  check<Strategy, float, false>(kSmall, {.data = 2, .tensor = 2}, 2);  // one sequence per data rank
  check<Strategy, float, true>(kSmall, {.data = 2, .tensor = 2}, 4);   // two: scratch for the strided collectives
  check<Strategy, Bf16Mixed, true>(kSmall, {.data = 2, .tensor = 1}, 2, 2);
}

}  // namespace

TEST_CASE("the plan's step peaks equal the allocator's: DDP") { check_strategy<optim::Ddp>(); }
TEST_CASE("the plan's step peaks equal the allocator's: ZeRO-1") { check_strategy<optim::Zero1>(); }
TEST_CASE("the plan's step peaks equal the allocator's: ZeRO-2") { check_strategy<optim::Zero2>(); }
TEST_CASE("the plan's step peaks equal the allocator's: FSDP") { check_strategy<optim::Fsdp>(); }

// FP8 (weft-train --dtype fp8-*): the tensors a step allocates are bf16 mixed precision's; the float8
// casts are a GEMM's transient scratch on the host (ops::ScaledGemm), outside the allocator's counts
// and the plan's, and the amaxes' all-reduces move floats in place.
TEST_CASE("the plan's step peaks equal the allocator's in FP8, tensor 2 with sequence parallelism") {
  check<optim::Zero2, Fp8Rowwise, true>(kSmall, {.data = 2, .tensor = 2}, 4);
  check<optim::Fsdp, Fp8Tensorwise, false>(kSmall, {.data = 2, .tensor = 2}, 2, 2);
}

TEST_CASE("the plan's step peaks equal the allocator's under selective and full recompute") {
  check<optim::Zero2, float, false, recompute::Selective>(kSmall, {.data = 1, .tensor = 2}, 2);
  check<optim::Fsdp, float, true, recompute::Full>(kSmall, {.data = 2, .tensor = 2}, 4);
  check<optim::Ddp, double, false, recompute::Full>(kSmall, {.data = 1, .tensor = 1}, 1);
}

// Pipelines: footprint::pipeline_step against the allocator on every pipe rank, for every schedule
// and every data strategy; sends, receives, each micro-batch's context and, for ZB-H1, the deferred
// weight gradients. Exact, as above.
namespace {

template <class Strategy, class P, bool SP, class R = recompute::None>
void check_pipeline(const gpt2::Config& c, MeshShape shape, pipeline::Kind kind, int v, std::int64_t micro, int m) {
  const int ranks = shape.data * shape.pipe * shape.tensor;
  const pipeline::Table table = pipeline::make_table(kind, shape.pipe, m, v);
  std::vector<Measured> got(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](ThreadComm& w) {
    Mesh mesh{w, shape};
    Host host;
    using Model = gpt2::Model<P, SP, R>;
    const auto part = pipeline::Partition::even(shape.pipe, v, c.layers);
    Model gpt(host, c, mesh.spread(), micro, part.placement(mesh.coord().pipe));
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{}, mesh);
    pipeline::Pipeline<Model, decltype(mesh)> pp(gpt, table, part, mesh);
    const auto [x, y] = tokens(c, micro, shape.data, mesh.coord().data);
    const std::vector<nn::MicroBatch> mbs(static_cast<std::size_t>(m), nn::MicroBatch{{x, y}, micro, 1.0 / m});
    record(
        got[static_cast<std::size_t>(w.rank())], host,
        [&] {
          dp.zero_grad();
          pp.run(mbs, dp);
          dp.step(1e-3, 1.0);
        },
        footprint::pipeline_step<Strategy, P, SP, R>(c, mesh.spread(), micro, table, mesh.coord().pipe));
  });
  compare(got, cat(Strategy::name(), SP ? "-sp " : " ", precision_t<P>::name(), " schedule ", static_cast<int>(kind),
                   " pipe ", shape.pipe, " x ", v, " data ", shape.data, " tensor ", shape.tensor, " micro ", micro,
                   " x ", m));
}

// Four layers: two virtual stages on each of two pipe ranks for the interleaved schedule.
constexpr gpt2::Config kPipe{.vocab = 37, .seq = 8, .layers = 4, .heads = 2, .width = 8};

template <class Strategy>
void check_schedules() {
  using pipeline::Kind;
  for (Kind kind : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved, Kind::zero_bubble_h1})
    check_pipeline<Strategy, float, false>(kPipe, {.data = 2, .pipe = 2}, kind, kind == Kind::interleaved ? 2 : 1, 2,
                                           4);
}

}  // namespace

TEST_CASE("the plan's pipeline step peaks equal the allocator's on every pipe rank: DDP") {
  check_schedules<optim::Ddp>();
}
TEST_CASE("the plan's pipeline step peaks equal the allocator's on every pipe rank: ZeRO-1") {
  check_schedules<optim::Zero1>();
}
TEST_CASE("the plan's pipeline step peaks equal the allocator's on every pipe rank: ZeRO-2") {
  check_schedules<optim::Zero2>();
}
TEST_CASE("the plan's pipeline step peaks equal the allocator's on every pipe rank: FSDP") {
  check_schedules<optim::Fsdp>();
}

TEST_CASE("the plan's pipeline step peaks: tensor and sequence parallel stages, mixed precision, recompute, pipe 3") {
  using pipeline::Kind;
  check_pipeline<optim::Fsdp, float, true>(kPipe, {.pipe = 2, .tensor = 2}, Kind::one_f_one_b, 1, 4, 2);
  check_pipeline<optim::Zero2, Bf16Mixed, true>(kPipe, {.pipe = 2, .tensor = 2}, Kind::zero_bubble_h1, 1, 2, 3);
  check_pipeline<optim::Ddp, float, false, recompute::Selective>(kPipe, {.pipe = 2}, Kind::interleaved, 2, 1, 4);
  check_pipeline<optim::Fsdp, float, false, recompute::Full>(kPipe, {.pipe = 2}, Kind::zero_bubble_h1, 1, 1, 4);
  // Pipe rank 2 keeps two weight passes pending under ZB-H1.
  constexpr gpt2::Config three{.vocab = 37, .seq = 8, .layers = 3, .heads = 2, .width = 8};
  check_pipeline<optim::Fsdp, float, false>(three, {.pipe = 3}, Kind::zero_bubble_h1, 1, 1, 5);
  check_pipeline<optim::Zero1, float, false>(three, {.pipe = 3}, Kind::one_f_one_b, 1, 1, 5);
}

// The step's plan is a constant too: GPT-2 124M at B = 8, T = 1024 under FSDP on 8 ranks in bf16
// keeps its activations (not its state) as the largest part, and recompute trades them away.
namespace {
constexpr gpt2::Config kGpt2Step{.vocab = 50257, .seq = 1024, .layers = 12, .heads = 12, .width = 768};
constexpr Spread kEightStep{.data_degree = 8, .tensor_degree = 1};
constexpr auto kKeep = footprint::step<optim::Fsdp, Bf16Mixed, false, recompute::None>(kGpt2Step, kEightStep, 64);
constexpr auto kFull = footprint::step<optim::Fsdp, Bf16Mixed, false, recompute::Full>(kGpt2Step, kEightStep, 64);
static_assert(kKeep.peak.of(Category::activations) > 4 * kKeep.after.total(),
              "at 8 sequences of 1024 per rank, activations dominate the state");
static_assert(kFull.peak.of(Category::activations) * 3 < kKeep.peak.of(Category::activations),
              "full recompute keeps a third or less");
static_assert(kKeep.after.total() == kFull.after.total(), "recompute does not change the persistent state");
}  // namespace

// A pipeline's plan is a constant too: GPT-2 124M on 4 pipe ranks, 8 micro-batches of 8 sequences
// in bf16 with FSDP over 8 data ranks. GPipe keeps all 8 micro-batches in flight on rank 0, 1F1B at
// most 4 (p - r): checked by the compiler, exactly. A micro-batch in flight adds kEach to rank 0's
// activation peak (the peak with 2 micro-batches less the peak with 1), so GPipe's peak is the one
// micro-batch peak plus 7 x kEach and 1F1B's plus 3 x kEach (a 1F1B that kept one more in flight
// would still pass the old bound, GPipe's peak above 1.5 x 1F1B's).
namespace {
constexpr Spread kPipeEight{.data_degree = 8, .tensor_degree = 1};
constexpr std::int64_t pipe_activations(pipeline::Kind k, int m) {
  return footprint::pipeline_step<optim::Fsdp, Bf16Mixed>(kGpt2Step, kPipeEight, 64, pipeline::make_table(k, 4, m), 0)
      .peak.of(Category::activations);
}
constexpr auto kGpipe = footprint::pipeline_step<optim::Fsdp, Bf16Mixed>(
    kGpt2Step, kPipeEight, 64, pipeline::make_table(pipeline::Kind::gpipe, 4, 8), 0);
constexpr auto k1f1b = footprint::pipeline_step<optim::Fsdp, Bf16Mixed>(
    kGpt2Step, kPipeEight, 64, pipeline::make_table(pipeline::Kind::one_f_one_b, 4, 8), 0);
constexpr std::int64_t kOneInFlight = pipe_activations(pipeline::Kind::gpipe, 1);
constexpr std::int64_t kEach = pipe_activations(pipeline::Kind::gpipe, 2) - kOneInFlight;
static_assert(kEach > 0, "a second micro-batch in flight adds activations");
static_assert(kGpipe.peak.of(Category::activations) == kOneInFlight + 7 * kEach,
              "GPipe keeps all 8 micro-batches in flight on the first pipe rank");
static_assert(k1f1b.peak.of(Category::activations) == kOneInFlight + 3 * kEach,
              "1F1B keeps p = 4 micro-batches in flight on the first pipe rank");
static_assert(kGpipe.after.total() == k1f1b.after.total(), "the schedule does not change the persistent state");
}  // namespace
