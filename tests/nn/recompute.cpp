// Recompute policies: what a GPT-2 block keeps for backward, measured by the allocator, against the
// formula for weft's layers (per rank, in elements; B batch, T sequence, C width, H heads, tp the
// tensor degree, Ts = T/tp under sequence parallelism and T otherwise):
//
//   None       2 B Ts C + 4 B Ts     the two LayerNorm inputs and their (mean, rstd)
//            + 2 B T C               the inputs of the QKV and MLP-up projections (gathered under SP)
//            + 12 B T C / tp         qkv (3C), attention output (C), MLP pre-activation and GELU output (4C each)
//            + B H T^2 / tp          the attention probabilities
//   Selective  None - B H T^2 / tp   (recomputed from qkv in backward)
//   Full       B Ts C                the block input only
//
// The test asserts the measurement equals the formula to the byte (every saved buffer is one the
// formula names, so one more kept buffer fails it), and that gradients do not depend on the policy
// (equivalence tests). The peak during backward has no closed form here; what is checked of backward
// is what it allocates: exactly what each policy dropped, rebuilt (against None's backward).
#include <doctest/doctest.h>

#include <mutex>

#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/gpt2/model.hpp"

using namespace weft;
using namespace weft::nn;

namespace {

constexpr std::int64_t B = 2, T = 32, C = 32, H = 4;

template <class Policy>
double formula(int tp, bool sp) {
  const double Ts = sp ? static_cast<double>(T) / tp : static_cast<double>(T);
  const double probs = static_cast<double>(B * H * T * T) / tp;
  const double none = 2.0 * B * Ts * C + 4.0 * B * Ts + 2.0 * B * T * C + 12.0 * B * T * C / tp + probs;
  if constexpr (std::same_as<Policy, recompute::Full>) return B * Ts * C * 8.0;
  else if constexpr (std::same_as<Policy, recompute::Selective>) return (none - probs) * 8.0;
  else return none * 8.0;
}

struct Measured {
  std::int64_t held = 0, peak = 0;
  std::int64_t forward_allocated = 0, backward_allocated = 0;  // activation bytes each pass allocated
};

template <bool SP, class Policy>
Measured measure(int tp) {
  Measured out;
  std::mutex mu;
  run_threads(tp, [&](ThreadComm& world) {
    Mesh mesh{world, {.tensor = tp}};
    Host h;
    using S = gpt2::Spec<double, SP, Policy>;
    using Blk = typename S::Block;
    Blk block = S::make_block(h, {.seq = T, .layers = 2, .heads = H, .width = C, .seed = 3}, mesh.spread(), 0);
    auto x = Tensor<double, typename S::A, Host>::empty(h, {B, T, C}, mesh.spread());
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = weft::normal(2, 0, static_cast<std::uint64_t>(i));
    typename Blk::Ctx ctx;
    const std::int64_t before = h.memory().current_of(Category::activations);
    const std::int64_t allocated0 = h.memory().allocated[static_cast<std::size_t>(Category::activations)];
    h.allocator.reset_peak();
    auto y = block.forward(ctx, x, mesh);
    const std::int64_t allocated1 = h.memory().allocated[static_cast<std::size_t>(Category::activations)];
    // The output is an activation too (redistributions keep their input's category), but it is the
    // block's result, not what it keeps for backward.
    REQUIRE(y.category() == Category::activations);
    const std::int64_t held = h.memory().current_of(Category::activations) - before - y.bytes();
    block.backward(ctx, y, mesh);
    const std::int64_t peak = h.memory().peak_of(Category::activations) - before;
    const std::int64_t allocated2 = h.memory().allocated[static_cast<std::size_t>(Category::activations)];
    if (world.rank() != 0) return;
    std::lock_guard lock(mu);
    out = {held, peak, allocated1 - allocated0, allocated2 - allocated1};
  });
  return out;
}

template <bool SP, class Policy>
void check(int tp, const char* name) {
  const Measured m = measure<SP, Policy>(tp);
  const double f = formula<Policy>(tp, SP);
  CHECK_MESSAGE(static_cast<double>(m.held) == f, std::string(name), " tp ", tp, " SP ", SP, ": measured ", m.held,
                " bytes, formula ", f);
  MESSAGE(std::string(name), " tp ", tp, (SP ? " SP" : "   "), ": kept ", m.held, " bytes (formula ", f, ")");
}

}  // namespace

TEST_CASE("activation bytes kept per block match the formula of each recompute policy") {
  for (int tp : {1, 2, 4}) {
    check<false, recompute::None>(tp, "None     ");
    check<false, recompute::Selective>(tp, "Selective");
    check<false, recompute::Full>(tp, "Full     ");
    check<true, recompute::None>(tp, "None     ");
    check<true, recompute::Selective>(tp, "Selective");
    check<true, recompute::Full>(tp, "Full     ");
  }
}

TEST_CASE("the policies order as they should: Full < Selective < None") {
  CHECK(measure<false, recompute::Full>(2).held < measure<false, recompute::Selective>(2).held);
  CHECK(measure<false, recompute::Selective>(2).held < measure<false, recompute::None>(2).held);
}

TEST_CASE("backward rebuilds what a policy dropped: Selective the probabilities, Full the whole forward, to the byte") {
  // The activation bytes each backward allocates, against None's: Selective's rebuilds the
  // probabilities and the attention output computed beside them (B, T, C/tp); Full's re-runs the
  // forward, allocating what None's forward did. A policy that skipped its recomputation (reading
  // stale or missing buffers), or rebuilt outside the allocator, allocates less and fails.
  for (int tp : {1, 2}) {
    const std::int64_t probs = B * H * T * T / tp * 8, output = B * T * C / tp * 8;
    const Measured none = measure<false, recompute::None>(tp), sel = measure<false, recompute::Selective>(tp),
                   full = measure<false, recompute::Full>(tp);
    CAPTURE(tp);
    CHECK(none.peak >= none.held);
    CHECK(sel.backward_allocated == none.backward_allocated + probs + output);
    CHECK(full.backward_allocated == none.backward_allocated + none.forward_allocated);
    MESSAGE("tp ", tp, ": backward allocated None ", none.backward_allocated, ", Selective ", sel.backward_allocated,
            " (+ ", probs, " probabilities + ", output, " output), Full ", full.backward_allocated,
            " (+ None's forward ", none.forward_allocated, ")");
  }
}
