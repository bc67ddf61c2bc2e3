// weft::footprint.s persistent memory against the allocators' counts: for every data-parallel strategy,
// f64, f32 and bf16 mixed precision, tensor and data degrees, and pipeline placements (the tied
// table split over two ranks), the planned bytes per category equal what each rank's allocator
// holds once the model and its data-parallel protocol are built. Exact: both count the same
// buffers, so any difference is a planning error.
#include <doctest/doctest.h>

#include <array>
#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/cost/memory.hpp"
#include "weft/device/host/host.hpp"
#include "weft/models/gpt2/footprint.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/pipeline/pipelined.hpp"

using namespace weft;

namespace {

constexpr std::array kPersistent{Category::parameters, Category::gradients, Category::master_weights,
                                 Category::optimizer_state};

// Every rank's measured and planned bytes, per persistent category.
template <class Strategy, class P>
void check(const gpt2::Config& c, MeshShape shape, int virtual_stages = 1) {
  const int ranks = shape.data * shape.pipe * shape.tensor;
  std::vector<std::array<std::int64_t, 4>> measured(static_cast<std::size_t>(ranks)), planned(measured);
  std::vector<char> even_matches(static_cast<std::size_t>(ranks), 0);
  run_threads(ranks, [&](ThreadComm& w) {
    Mesh mesh{w, shape};
    Host host;
    const auto place = pipeline::Partition::even(shape.pipe, virtual_stages, c.layers).placement(mesh.coord().pipe);
    gpt2::Model<P> gpt(host, c, mesh.spread(), 2 * shape.data, place);
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{}, mesh);
    const footprint::Holds holds = footprint::Holds::of(place);
    // what weft-train plans with
    const footprint::Holds even = footprint::Holds::even(c, shape.pipe, mesh.coord().pipe);
    even_matches[static_cast<std::size_t>(w.rank())] =
        holds.blocks == even.blocks && holds.embedding == even.embedding && holds.head == even.head;
    const footprint::Memory m = footprint::persistent<Strategy, P>(c, mesh.spread(), holds);
    for (std::size_t k = 0; k < kPersistent.size(); ++k) {
      measured[static_cast<std::size_t>(w.rank())][k] = host.memory().current_of(kPersistent[k]);
      planned[static_cast<std::size_t>(w.rank())][k] = m.of(kPersistent[k]);
    }
  });
  for (int r = 0; r < ranks; ++r) CHECK(even_matches[static_cast<std::size_t>(r)]);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t k = 0; k < kPersistent.size(); ++k) {
      INFO(Strategy::name(), " ", precision_t<P>::name(), " data ", shape.data, " pipe ", shape.pipe, " tensor ",
           shape.tensor, " rank ", r, " ", name(kPersistent[k]));
      CHECK(measured[static_cast<std::size_t>(r)][k] == planned[static_cast<std::size_t>(r)][k]);
      CHECK(measured[static_cast<std::size_t>(r)][k] >= 0);
    }
}

template <class Strategy>
void check_all() {
  // Odd sizes, so that the padding to the data degree and of the vocabulary to the tensor degree count.
  const gpt2::Config c{.vocab = 37, .seq = 6, .layers = 3, .heads = 2, .width = 10};
  check<Strategy, double>(c, {.data = 1, .tensor = 1});
  check<Strategy, float>(c, {.data = 2, .tensor = 2});
  check<Strategy, Bf16Mixed>(c, {.data = 4, .tensor = 1});
  check<Strategy, Bf16Mixed>(c, {.data = 1, .tensor = 2});
  check<Strategy, float>(c, {.data = 3, .tensor = 1});
  check<Strategy, float>({.vocab = 37, .seq = 6, .layers = 4, .heads = 2, .width = 10},
                         {.data = 2, .pipe = 2, .tensor = 1});
}

}  // namespace

TEST_CASE("the plan's persistent bytes equal the allocators' counts: DDP") { check_all<optim::Ddp>(); }
TEST_CASE("the plan's persistent bytes equal the allocators' counts: ZeRO-1") { check_all<optim::Zero1>(); }
TEST_CASE("the plan's persistent bytes equal the allocators' counts: ZeRO-2") { check_all<optim::Zero2>(); }
TEST_CASE("the plan's persistent bytes equal the allocators' counts: FSDP") { check_all<optim::Fsdp>(); }

// With sizes known at compile time the plan is a constant: a configuration can be checked against a
// memory budget by the compiler (tests/cost/compile_fail/budget.cpp shows the refusal).
namespace {
constexpr gpt2::Config kGpt2{.vocab = 50257, .seq = 1024, .layers = 12, .heads = 12, .width = 768};
constexpr Spread kEight{.data_degree = 8, .tensor_degree = 1};
constexpr std::int64_t kFsdpBytes =
    footprint::persistent<optim::Fsdp, Bf16Mixed>(kGpt2, kEight, footprint::Holds::all(kGpt2)).total();
constexpr std::int64_t kDdpBytes =
    footprint::persistent<optim::Ddp, Bf16Mixed>(kGpt2, kEight, footprint::Holds::all(kGpt2)).total();
static_assert(kFsdpBytes < 300'000'000,
              "GPT-2 124M under FSDP on 8 data ranks holds under 300 MB of persistent state per rank");
static_assert(kDdpBytes > 7 * kFsdpBytes, "DDP holds every byte that FSDP spreads over 8 ranks");
}  // namespace

TEST_CASE("GPT-2 124M in bf16: 18 bytes per parameter under DDP, an eighth of it under FSDP on 8 ranks") {
  // GPT-2's 124,439,808 parameters (the vocabulary of 50,257 is not padded at tensor degree 1):
  // 12 x (12 C^2 + 13 C) + (V + T) C + 2 C. bf16 parameters and f32 gradients (2 + 4 bytes), f32 master (4), AdamW's
  // two f32 states (8): 18 bytes each under DDP.
  const std::int64_t params = 12 * (12 * 768 * 768 + 13 * 768) + (50257 + 1024) * 768 + 2 * 768;
  CHECK(params == 124'439'808);
  CHECK(kDdpBytes == 18 * params);
  // FSDP: every unit padded to a multiple of 8, then an eighth of it.
  CHECK(kFsdpBytes >= 18 * params / 8);
  CHECK(kFsdpBytes <= 18 * (params + 8 * 14) / 8);
}
