// weft::estimate (the time model) against closed forms: the alpha-beta cost of each collective, the
// FLOPs of a step's GEMMs (6 N per token for the matrices, 2 more for a recomputed forward), the
// data-parallel bytes each strategy moves (equal to the plan's gradient and parameter bytes), and a
// breakdown that adds its parts. The measured rates and the 25% target against real steps are in
// benchmarks/plan (speed is measured in benchmarks, not in tests).
#include <doctest/doctest.h>

#include "weft/cost/time.hpp"
#include "weft/models/gpt2/estimate.hpp"

using namespace weft;
using estimate::collective_seconds;

TEST_CASE("collectives cost what the ring and tree formulas say") {
  const estimate::Link l{.alpha = 1e-5, .beta = 1e-9};
  const std::int64_t S = 1 << 20;
  // Ring all-reduce over 4: 2(n-1) alpha + 2 (n-1)/n S beta = 6e-5 + 1.5 x 2^20 x 1e-9.
  const double ring = 6e-5 + 1.5 * static_cast<double>(S) * 1e-9;
  const double tree = 2 * 2 * 1e-5 + 2.0 * static_cast<double>(S) * 1e-9;  // 2 log2(4) alpha + 2 S beta
  CHECK(collective_seconds(Collective::all_reduce, 4, S, l) == doctest::Approx(std::min(ring, tree)).epsilon(1e-12));
  // Small messages: the tree's fewer latencies win at 64 ranks.
  const double ring64 = 126 * 1e-5 + 2 * 63.0 / 64 * 8 * 1e-9, tree64 = 12 * 1e-5 + 16 * 1e-9;
  CHECK(collective_seconds(Collective::all_reduce, 64, 8, l) == doctest::Approx(tree64).epsilon(1e-12));
  CHECK(tree64 < ring64);
  // All-gather and reduce-scatter: (n-1) alpha + (n-1)/n S beta.
  CHECK(collective_seconds(Collective::all_gather, 8, S, l) ==
        doctest::Approx(7e-5 + 7.0 / 8 * S * 1e-9).epsilon(1e-12));
  CHECK(collective_seconds(Collective::reduce_scatter, 8, S, l) ==
        doctest::Approx(7e-5 + 7.0 / 8 * S * 1e-9).epsilon(1e-12));
  // One rank moves nothing.
  CHECK(collective_seconds(Collective::all_reduce, 1, S, l) == 0);
}

namespace {
constexpr gpt2::Config kCfg{.vocab = 96, .seq = 16, .layers = 3, .heads = 4, .width = 32};

double gemm_flops(const estimate::Work& w) {
  double f = 0;
  for (const auto& g : w.gemms) f += static_cast<double>(g.count) * g.flops();
  return f;
}
std::int64_t comm_bytes(const estimate::Work& w, Collective c, Axis a) {
  std::int64_t b = 0;
  for (const auto& x : w.comms)
    if (x.collective == c && x.axis == a) b += x.bytes * x.count;
  return b;
}
}  // namespace

TEST_CASE("a step's GEMMs are 6 FLOPs per matrix element per token, 2 more per recomputed forward") {
  const Spread s{.data_degree = 2, .tensor_degree = 2};
  const std::int64_t micro = 4, mbs = 3, C = kCfg.width;
  const double tokens = static_cast<double>(micro / 2 * kCfg.seq * mbs);  // this rank's
  const double per_layer = 12.0 * C * C / 2, head = static_cast<double>(nn::padded_vocab(kCfg.vocab, 2) / 2 * C);
  const auto none = estimate::work<optim::Ddp, F32>(kCfg, s, micro, mbs);
  CHECK(gemm_flops(none) == doctest::Approx(6 * tokens * (kCfg.layers * per_layer + head)).epsilon(1e-12));
  const auto full = estimate::work<optim::Ddp, F32, false, recompute::Full>(kCfg, s, micro, mbs);
  CHECK(gemm_flops(full) ==
        doctest::Approx(6 * tokens * (kCfg.layers * per_layer + head) + 2 * tokens * kCfg.layers * per_layer)
            .epsilon(1e-12));
  // The attention core: 2 T (T + 1) hd per (sequence, head) forward, twice that backward, and a
  // recomputed forward under Full.
  const double core = 2.0 * (micro / 2) * (kCfg.heads / 2) * kCfg.seq * (kCfg.seq + 1) * (C / kCfg.heads);
  CHECK(none.attention_flops == doctest::Approx(3 * core * kCfg.layers * mbs).epsilon(1e-12));
  CHECK(full.attention_flops == doctest::Approx(4 * core * kCfg.layers * mbs).epsilon(1e-12));
}

TEST_CASE("the data-parallel collectives move the plan's gradient and parameter bytes") {
  const Spread s{.data_degree = 4, .tensor_degree = 1};
  const std::int64_t micro = 8, mbs = 2;
  const auto full_state = footprint::persistent<optim::Ddp, F32>(kCfg, s, footprint::Holds::all(kCfg));
  const std::int64_t grads = full_state.of(Category::gradients), params = full_state.of(Category::parameters);
  // DDP: one all-reduce of every gradient per step (on the last micro-batch), and the loss's and
  // the norm's 8 bytes.
  const auto ddp = estimate::work<optim::Ddp, F32>(kCfg, s, micro, mbs);
  CHECK(comm_bytes(ddp, Collective::all_reduce, Axis::data) == grads + 8 * mbs + 8);
  // ZeRO-2: a reduce-scatter of every gradient per micro-batch, an all-gather of the values per step.
  const auto z2 = estimate::work<optim::Zero2, F32>(kCfg, s, micro, mbs);
  CHECK(comm_bytes(z2, Collective::reduce_scatter, Axis::data) == grads * mbs);
  CHECK(comm_bytes(z2, Collective::all_gather, Axis::data) == params);
  // FSDP: the blocks gathered twice per micro-batch (forward, backward), the embedding and the head once.
  const auto fsdp = estimate::work<optim::Fsdp, F32>(kCfg, s, micro, mbs);
  const std::int64_t block = (gpt2::block_elements(kCfg, 1) + 3) / 4 * 4 * 4;  // padded to 4, f32
  CHECK(comm_bytes(fsdp, Collective::all_gather, Axis::data) == (params + kCfg.layers * block) * mbs);
}

TEST_CASE("the step time adds its parts, and doubling a rate halves its part") {
  const Spread s{.data_degree = 2, .tensor_degree = 2};
  const auto w = estimate::work<optim::Zero1, F32, true>(kCfg, s, 4, 1);
  estimate::Rates r;
  r.gemm_flops = [](const estimate::Gemm&) { return 1e9; };
  r.attention_flops = 1e9;
  r.elements = {.gelu = 1e8, .layernorm = 1e8, .cross_entropy = 1e8, .adamw = 1e8};
  r.bandwidth = r.first_touch = 1e10;
  r.tensor = r.data = {.alpha = 1e-5, .beta = 1e-9};
  const auto b = estimate::seconds(w, r);
  CHECK(b.gemm == doctest::Approx(gemm_flops(w) / 1e9));
  CHECK(b.attention == doctest::Approx(w.attention_flops / 1e9));
  // Each axis's part: its collectives priced one by one on its link (the formulas checked above),
  // so a collective counted on the wrong axis, or twice, moves both parts.
  double tensor = 0, data = 0;
  for (const estimate::Comm& c : w.comms)
    (c.axis == Axis::tensor ? tensor : data) +=
        static_cast<double>(c.count) *
        collective_seconds(c.collective, c.degree, c.bytes, c.axis == Axis::tensor ? r.tensor : r.data);
  CHECK(tensor > 0);  // SP's gathers and scatters on the tensor axis
  CHECK(b.tensor_comm == doctest::Approx(tensor).epsilon(1e-12));
  CHECK(b.data_comm == doctest::Approx(data).epsilon(1e-12));
  r.gemm_flops = [](const estimate::Gemm&) { return 2e9; };
  CHECK(estimate::seconds(w, r).gemm == doctest::Approx(b.gemm / 2));
}

namespace {
estimate::Rates fixed_rates() {
  estimate::Rates r;
  r.gemm_flops = [](const estimate::Gemm& g) { return g.m > 16 ? 2e9 : 1e9; };  // shapes differ in rate
  r.attention_flops = 1e9;
  r.elements = {.gelu = 1e8, .layernorm = 2e8, .cross_entropy = 1e8, .adamw = 3e8};
  r.bandwidth = r.first_touch = 1e10;
  r.tensor = r.data = {.alpha = 1e-5, .beta = 1e-9};
  return r;
}

// Rates under which only the GEMMs and the attention core take time (1 GFLOP/s each; every other
// part at 1e300 per second), so a block's and the ends' seconds have closed forms that do not come
// from work(): for the tiny model below on one rank with micro-batches of 2 sequences of 8 tokens,
//   a block: 6 x 16 tokens x 12 C^2 (the four matrices) + 3 x 2 x 2 x heads 2 x T (T + 1) x hd 4
//            (the attention core, forward once and backward twice) = 73728 + 3456 FLOPs,
//   the ends: the head's GEMM, 6 x 16 tokens x C x vocab 37 = 28416 FLOPs (the embedding is a
//            gather, the norm and the loss elementwise: free here).
estimate::Rates gemm_only_rates() {
  estimate::Rates r = fixed_rates();
  r.gemm_flops = [](const estimate::Gemm&) { return 1e9; };  // one rate for every shape
  r.elements = {.gelu = 1e300, .layernorm = 1e300, .cross_entropy = 1e300, .adamw = 1e300};
  r.bandwidth = r.first_touch = 1e300;
  return r;
}
constexpr gpt2::Config kTiny{.vocab = 37, .seq = 8, .layers = 4, .heads = 2, .width = 8};
constexpr double kBlockSeconds = (6.0 * 16 * 12 * 8 * 8 + 3.0 * 2 * 2 * 2 * 8 * 9 * 4) / 1e9;
constexpr double kEndsSeconds = 6.0 * 16 * 8 * 37 / 1e9;
}  // namespace

TEST_CASE("a pipeline's stage costs against closed forms that do not come from work()") {
  const auto r = gemm_only_rates();
  const Spread one{.data_degree = 1, .tensor_degree = 1};
  for (int m : {1, 3}) {
    CAPTURE(m);
    // One pipe rank: m micro-batches of 4 blocks and the ends, nothing else on the clock.
    const auto p1 = estimate::pipeline_seconds<optim::Ddp, F32, false>(
        kTiny, one, 2, pipeline::make_table(pipeline::Kind::one_f_one_b, 1, m), r, r.data);
    CHECK(p1.block == doctest::Approx(kBlockSeconds).epsilon(1e-12));
    CHECK(p1.ends == doctest::Approx(kEndsSeconds).epsilon(1e-12));
    CHECK(p1.step == doctest::Approx(m * (4 * kBlockSeconds + kEndsSeconds)).epsilon(1e-12));
  }
}

TEST_CASE("a pipeline of one rank costs what the step without a pipeline costs (the split is exact)") {
  // pipeline_seconds separates the model by linearity into per-block and per-micro-batch parts;
  // one pipe rank running them in order must give back work() + seconds() to rounding, for every
  // schedule, micro-batch count and strategy.
  const auto r = fixed_rates();
  const gpt2::Config c{.vocab = 37, .seq = 8, .layers = 4, .heads = 2, .width = 8};
  const Spread s{.data_degree = 2, .tensor_degree = 2};
  for (int m : {1, 3, 8}) {
    CAPTURE(m);
    const double whole = estimate::seconds(estimate::work<optim::Fsdp, F32, true>(c, s, 4, m), r).total();
    for (pipeline::Kind kind : {pipeline::Kind::gpipe, pipeline::Kind::one_f_one_b, pipeline::Kind::zero_bubble_h1}) {
      const auto p =
          estimate::pipeline_seconds<optim::Fsdp, F32, true>(c, s, 4, pipeline::make_table(kind, 1, m), r, r.data);
      CHECK(p.step == doctest::Approx(whole).epsilon(1e-9));
      CHECK(p.bubble[0] == doctest::Approx(0.0));
    }
    const double ddp = estimate::seconds(estimate::work<optim::Ddp, Bf16Mixed, false>(c, s, 4, m), r).total();
    const auto p = estimate::pipeline_seconds<optim::Ddp, Bf16Mixed, false>(
        c, s, 4, pipeline::make_table(pipeline::Kind::one_f_one_b, 1, m), r, r.data);
    CHECK(p.step == doctest::Approx(ddp).epsilon(1e-9));
  }
}

TEST_CASE("a pipeline of two ranks: GPipe's closed form, and messages on the critical path") {
  // Two stages, costs a (stage 0: two blocks) and b (stage 1: two blocks and the ends) per
  // forward-and-backward; GPipe with m micro-batches and messages of time d: rank 1's forwards run
  // back to back once the first activation arrives (b > a here), its backwards follow, and rank 0's
  // last backward waits for the last gradient:
  //   end of rank 0 = a/3 + d + m b/3 + m 2b/3 + d + 2a/3 = a + b m + 2 d   (b >= a)
  const auto r = fixed_rates();
  const gpt2::Config c{.vocab = 37, .seq = 8, .layers = 4, .heads = 2, .width = 8};
  const Spread s{.data_degree = 1, .tensor_degree = 1};
  const estimate::Link link{.alpha = 1e-4, .beta = 1e-8};
  for (int m : {1, 4}) {
    const auto p = estimate::pipeline_seconds<optim::Ddp, F32, false>(
        c, s, 2, pipeline::make_table(pipeline::Kind::gpipe, 2, m), r, link);
    const double a = 2 * p.block, b = 2 * p.block + p.ends, d = p.message;
    CHECK(p.message == doctest::Approx(1e-4 + 2.0 * 8 * 8 * 4 * 1e-8));  // (2, 8, 8) f32 activations
    REQUIRE(b >= a);
    CHECK(p.makespan == doctest::Approx(a + b * m + 2 * d).epsilon(1e-9));
    const double tied = estimate::collective_seconds(Collective::all_reduce, 2, 37 * 8 * 4, link);
    CHECK(p.step ==
          doctest::Approx(std::max(p.makespan + p.once[0], a / 3 + d + b * m + p.once[1]) + tied).epsilon(1e-9));
  }
  // The same closed form with a and b from the block's and the ends' FLOPs (gemm_only_rates), not
  // from the function's own fields; nothing but the schedule, the messages and the tied all-reduce
  // adds to them (the optimizer is free at these rates).
  const auto g = gemm_only_rates();
  const double a = 2 * kBlockSeconds, b = 2 * kBlockSeconds + kEndsSeconds, d = 1e-4 + 2.0 * 8 * 8 * 4 * 1e-8;
  const double tied = 2 * 1e-4 + 37 * 8 * 4 * 1e-8;  // ring all-reduce on 2 ranks: 2 alpha + 2 (1/2) S beta
  for (int m : {1, 4}) {
    CAPTURE(m);
    const auto p = estimate::pipeline_seconds<optim::Ddp, F32, false>(
        c, s, 2, pipeline::make_table(pipeline::Kind::gpipe, 2, m), g, link);
    CHECK(p.makespan == doctest::Approx(a + b * m + 2 * d).epsilon(1e-12));
    CHECK(p.step == doctest::Approx(a + b * m + 2 * d + tied).epsilon(1e-12));
  }
}
