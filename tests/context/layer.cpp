// Context parallelism in a layer (weft/nn/grouped_attention.hpp with Cx = context::Ring or
// context::AllGather) and in a Llama block (its other layers on the rank's rows, nn::TokenWise):
// the output, the input's gradient and every parameter's gradient on context 2 and 4, alone and
// beside tensor 2, against the same layer or block on one rank over the whole sequence;
// and the rotation and learned positions at a context rank's positions (weft/ops/positions.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "support/gradcheck.hpp"
#include "support/ranks.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/context/chunks.hpp"
#include "weft/models/llama/model.hpp"
#include "weft/nn/grouped_attention.hpp"
#include "weft/ops/all.hpp"

using namespace weft;
using Index = std::int64_t;

namespace {

// Llama's rotation with the llama3 scaling's three frequency bands all present at these positions.
const ops::Rope kRope{
    .theta = 500, .factor = 4, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 8};
constexpr Index kB = 2, kT = 16, kC = 32, kH = 4;

// The rows of full (B, T, width) at context rank r's positions, into local (B, T/c, width).
template <class Local>
void take_rows(Local& local, const std::vector<double>& full, const context::Chunks& ch, int r, Index width) {
  for (Index b = 0; b < kB; ++b)
    for (Index t = 0; t < ch.local(); ++t)
      for (Index k = 0; k < width; ++k)
        local[(b * ch.local() + t) * width + k] =
            full[static_cast<std::size_t>((b * ch.seq + ch.position(r, t)) * width + k)];
}

// The largest difference of local (B, T/c, width) from full's rows at rank r's positions.
double row_error(std::span<const double> local, const std::vector<double>& full, const context::Chunks& ch, int r,
                 Index width, Index B = kB) {
  double e = 0;
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < ch.local(); ++t)
      for (Index k = 0; k < width; ++k)
        e = test::worse(e, std::abs(local[static_cast<std::size_t>((b * ch.local() + t) * width + k)] -
                                    full[static_cast<std::size_t>((b * ch.seq + ch.position(r, t)) * width + k)]));
  return e;
}

double largest(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

struct Reference {
  std::vector<double> x, dy, y, dx;
  std::map<std::string, std::vector<double>> grads;  // by name, the whole parameter's
};

// The layer on one rank over the whole sequence.
template <class Mask = mask::Causal>
Reference reference(Index kv) {
  Reference ref{test::normals(static_cast<std::size_t>(kB * kT * kC), 21),
                test::normals(static_cast<std::size_t>(kB * kT * kC), 22),
                {},
                {},
                {}};
  Host h;
  const Spread s{};
  nn::GroupedQueryAttention<double, recompute::None, Host, context::None, Mask> attn(h, kC, kH, kv, kRope, s, 1, 3, 0.3,
                                                                                     0.3);
  auto x = Tensor<double, nn::act::Full, Host>::empty(h, {kB, kT, kC}, s);
  auto dy = Tensor<double, nn::act::Full, Host>::empty(h, {kB, kT, kC}, s);
  std::copy(ref.x.begin(), ref.x.end(), x.data());
  std::copy(ref.dy.begin(), ref.dy.end(), dy.data());
  typename decltype(attn)::Ctx ctx;
  auto y = attn.forward(ctx, x);
  auto dx = attn.backward(ctx, dy);
  ref.y.assign(y.data(), y.data() + y.numel());
  ref.dx.assign(dx.data(), dx.data() + dx.numel());
  attn.for_each_param("attn", [&](const std::string& n, auto& p) {
    ref.grads[n].assign(p.grad.data(), p.grad.data() + p.grad.numel());
  });
  return ref;
}

struct Errors {
  double y = 0, dx = 0, grad = 0;
  std::string worst_param;
};

// Each context rank's weight gradients sum over its own rows: the context group's sum (the context
// part of the data-parallel reduction over data x context ranks) is the whole sequence's. Returns
// how many parameters the layer has.
template <class Layer, AxisComms M>
std::size_t add_grad_errors(Layer& layer, const std::string& prefix, M& mesh, const Reference& ref, Errors& e) {
  std::size_t params = 0;
  layer.for_each_param(prefix, [&](const std::string& n, auto& p) {
    mesh.context().all_reduce(p.grad.span(), ReduceOp::sum);
    const std::vector<double>& want = ref.grads.at(n);
    double err = 0;
    for (Index i = 0; i < p.grad.numel(); ++i)
      err = test::worse(err, std::abs(p.grad[i] - want[static_cast<std::size_t>(p.grad.global_index(i))]));
    err /= largest(want);
    if (err >= e.grad) e.grad = err, e.worst_param = n;
    ++params;
  });
  return params;
}

// The worst of every rank's errors, the outputs' and input gradients' relative to the largest element.
Errors worst_of(const std::vector<Errors>& per, const Reference& ref) {
  Errors worst;
  for (const Errors& e : per) {
    worst.y = std::max(worst.y, e.y / largest(ref.y));
    worst.dx = std::max(worst.dx, e.dx / largest(ref.dx));
    if (e.grad >= worst.grad) worst.grad = e.grad, worst.worst_param = e.worst_param;
  }
  return worst;
}

template <class Cx, class Mask = mask::Causal>
Errors context_parallel(const Reference& ref, Index kv, int c, int tp) {
  std::vector<Errors> per(static_cast<std::size_t>(c * tp));
  std::vector<std::size_t> params(per.size());
  // The reference's names come from the same for_each_param: its count alone would follow a
  // parameter that both sides leave out. The layer has qkv and proj (no biases), by name.
  REQUIRE(ref.grads.size() == 2);
  REQUIRE(ref.grads.contains("attn.qkv.weight"));
  REQUIRE(ref.grads.contains("attn.proj.weight"));
  run_threads(c * tp, [&](ThreadComm& world) {
    Mesh mesh{world, {.context = c, .tensor = tp}};
    const Spread s = mesh.spread();
    const int r = s.context_index;
    const auto ch = context::Chunks::of(kT, c);
    Host h;
    using Attn = nn::GroupedQueryAttention<double, recompute::None, Host, Cx, Mask>;
    Attn attn(h, kC, kH, kv, kRope, s, 1, 3, 0.3, 0.3);
    auto x = Tensor<double, typename Attn::In, Host>::empty(h, {kB, kT, kC}, s);
    auto dy = Tensor<double, typename Attn::GradOut, Host>::empty(h, {kB, kT, kC}, s);
    REQUIRE(x.local_shape() == Shape{kB, kT / c, kC});
    take_rows(x, ref.x, ch, r, kC);
    take_rows(dy, ref.dy, ch, r, kC);
    typename Attn::Ctx ctx;
    auto y = attn.forward(ctx, x, mesh);  // Partial over tensor: summed here to compare
    mesh.tensor().all_reduce(y.span(), ReduceOp::sum);
    auto dx = attn.backward(ctx, dy, mesh);
    mesh.tensor().all_reduce(dx.span(), ReduceOp::sum);
    Errors e{row_error(y.span(), ref.y, ch, r, kC), row_error(dx.span(), ref.dx, ch, r, kC), 0, {}};
    params[static_cast<std::size_t>(world.rank())] = add_grad_errors(attn, "attn", mesh, ref, e);
    per[static_cast<std::size_t>(world.rank())] = e;
  });
  for (std::size_t n : params) CHECK(n == ref.grads.size());  // every parameter compared, none skipped
  return worst_of(per, ref);
}

template <class Cx, class Mask = mask::Causal>
void check_layer() {
  for (Index kv : {2, 4}) {
    const Reference ref = reference<Mask>(kv);
    for (int c : {2, 4})
      for (int tp : {1, 2}) {
        const Errors e = context_parallel<Cx, Mask>(ref, kv, c, tp);
        INFO(std::string(Cx::name), ", context ", c, " x tensor ", tp, ", ", kH, " heads over ", kv,
             " key-value heads, ", Mask::name);
        // 1e-12 of the largest element: double, the same sums in other orders (the log-sum-exp
        // merge of the blocks, the context group's sum of the weight gradients).
        CHECK(e.y <= 1e-12);
        CHECK(e.dx <= 1e-12);
        CHECK_MESSAGE(e.grad <= 1e-12, "worst parameter: ", e.worst_param);
        MESSAGE(std::string(Cx::name), " context ", c, " tensor ", tp, " kv ", kv, ": y ", e.y, ", dx ", e.dx,
                ", gradients ", e.grad);
      }
  }
}

}  // namespace

TEST_CASE(
    "grouped-query attention with the sequence over context 2 and 4 (alone and beside tensor 2) equals one rank: "
    "output, input gradient and every weight gradient within 1e-12 in double") {
  SUBCASE("ring") { check_layer<context::Ring>(); }
  SUBCASE("all-gather") { check_layer<context::AllGather>(); }
}

TEST_CASE(
    "bidirectional grouped-query attention (mask::Bidirectional) over context 2 and 4 equals one rank within 1e-12, "
    "and differs from the causal layer") {
  SUBCASE("ring") { check_layer<context::Ring, mask::Bidirectional>(); }
  SUBCASE("all-gather") { check_layer<context::AllGather, mask::Bidirectional>(); }
  // The same weights and input: every query row but the last sees other keys, so the outputs
  // differ by order 1 (the first row's by far the most).
  const Reference causal = reference(2), bidirectional = reference<mask::Bidirectional>(2);
  double diff = 0;
  for (std::size_t i = 0; i < causal.y.size(); ++i)
    diff = test::worse(diff, std::abs(causal.y[i] - bidirectional.y[i]));
  CHECK(diff >= 1e-2 * largest(causal.y));
  CHECK(nn::GroupedQueryAttention<double, recompute::None, Host, context::None, mask::Bidirectional>::name() ==
        "GroupedQueryAttention<bidirectional>");
  CHECK(nn::GroupedQueryAttention<double, recompute::None, Host, context::Ring, mask::Bidirectional>::name() ==
        "GroupedQueryAttention<context ring, bidirectional>");
}

namespace {

// A Llama block (llama::Spec::make_layer: RMSNorm, grouped attention with rotary positions, the
// SwiGLU MLP, both residuals) on one rank over the whole sequence, and with context parallelism.
const llama::Config kLlama{.vocab = 33,
                           .seq = kT,
                           .layers = 1,
                           .heads = 4,
                           .kv_heads = 2,
                           .width = kC,
                           .hidden = 24,
                           .rope = kRope,
                           .norm_eps = 1e-5,
                           .seed = 3,
                           .init_std = 0.2};

template <class Cx, class Recompute>
using LlamaBlock = llama::Spec<double, false, Recompute, Host, false, Cx>;

Reference block_reference() {
  Reference ref{test::normals(static_cast<std::size_t>(kB * kT * kC), 31),
                test::normals(static_cast<std::size_t>(kB * kT * kC), 32),
                {},
                {},
                {}};
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    auto layer = LlamaBlock<context::None, recompute::None>::make_layer(h, kLlama, mesh.spread(), 0);
    auto x = Tensor<double, nn::act::Full, Host>::empty(h, {kB, kT, kC}, mesh.spread());
    auto dy = Tensor<double, nn::act::Full, Host>::empty(h, {kB, kT, kC}, mesh.spread());
    std::copy(ref.x.begin(), ref.x.end(), x.data());
    std::copy(ref.dy.begin(), ref.dy.end(), dy.data());
    typename decltype(layer)::Ctx ctx;
    auto y = layer.forward(ctx, x, mesh);
    auto dx = layer.backward(ctx, dy, mesh);
    ref.y.assign(y.data(), y.data() + y.numel());
    ref.dx.assign(dx.data(), dx.data() + dx.numel());
    layer.for_each_param("layers.0", [&](const std::string& n, auto& p) {
      ref.grads[n].assign(p.grad.data(), p.grad.data() + p.grad.numel());
    });
  });
  return ref;
}

template <class Cx, class Recompute>
Errors block_context_parallel(const Reference& ref, int c, int tp) {
  std::vector<Errors> per(static_cast<std::size_t>(c * tp));
  std::vector<std::size_t> params(static_cast<std::size_t>(c * tp));
  run_threads(c * tp, [&](ThreadComm& world) {
    Mesh mesh{world, {.context = c, .tensor = tp}};
    const Spread s = mesh.spread();
    const int r = s.context_index;
    const auto ch = context::Chunks::of(kT, c);
    Host h;
    using Spec = LlamaBlock<Cx, Recompute>;
    auto layer = Spec::make_layer(h, kLlama, s, 0);
    using Layer = decltype(layer);
    auto x = Tensor<double, typename Layer::In, Host>::empty(h, {kB, kT, kC}, s);
    auto dy = Tensor<double, typename Layer::GradOut, Host>::empty(h, {kB, kT, kC}, s);
    take_rows(x, ref.x, ch, r, kC);
    take_rows(dy, ref.dy, ch, r, kC);
    typename Layer::Ctx ctx;
    auto y = layer.forward(ctx, x, mesh);     // Replicate over tensor: the stream
    auto dx = layer.backward(ctx, dy, mesh);  // Replicate over tensor (Megatron's convention)
    Errors e{row_error(y.span(), ref.y, ch, r, kC), row_error(dx.span(), ref.dx, ch, r, kC), 0, {}};
    params[static_cast<std::size_t>(world.rank())] = add_grad_errors(layer, "layers.0", mesh, ref, e);
    per[static_cast<std::size_t>(world.rank())] = e;
  });
  for (std::size_t n : params) CHECK(n == ref.grads.size());  // the same parameters, by the same names
  return worst_of(per, ref);
}

template <class Cx, class Recompute>
void check_block(const Reference& ref) {
  for (int c : {2, 4})
    for (int tp : {1, 2}) {
      const Errors e = block_context_parallel<Cx, Recompute>(ref, c, tp);
      INFO(std::string(Cx::name), ", context ", c, " x tensor ", tp);
      // 1e-12 of the largest element: double, the same sums in other orders.
      CHECK(e.y <= 1e-12);
      CHECK(e.dx <= 1e-12);
      CHECK_MESSAGE(e.grad <= 1e-12, "worst parameter: ", e.worst_param);
      MESSAGE("Llama block, ", std::string(Cx::name), " context ", c, " tensor ", tp, ": y ", e.y, ", dx ", e.dx,
              ", gradients ", e.grad, " (", e.worst_param, ")");
    }
}

}  // namespace

TEST_CASE(
    "a Llama block with the sequence over context 2 and 4 (alone and beside tensor 2) equals one rank: output, "
    "input gradient and every weight gradient within 1e-12 in double") {
  const Reference ref = block_reference();
  REQUIRE(ref.grads.size() == 6);  // attn_norm, qkv, proj, mlp_norm, gate_up, down
  SUBCASE("ring") { check_block<context::Ring, recompute::None>(ref); }
  SUBCASE("all-gather, the block recomputed in backward (recompute::Full)") {
    check_block<context::AllGather, recompute::Full>(ref);
  }
  SUBCASE("ring, the cheap layers recomputed in backward (recompute::Selective)") {
    check_block<context::Ring, recompute::Selective>(ref);
  }
  SUBCASE("ring, the block recomputed in backward (recompute::Full)") {
    check_block<context::Ring, recompute::Full>(ref);
  }
}

TEST_CASE("the rotation at a context rank's positions equals the whole sequence's rotation at those rows") {
  // Exact: each row's angles depend on its position only, computed the same way in both.
  const Index B = 2, T = 24, G = 2, g = 2, hd = 8, row = G * (g + 2) * hd;
  const std::vector<double> full = test::normals(static_cast<std::size_t>(B * T * row), 5);
  Host h;
  std::vector<double> whole = full;
  ops::Rotary<Host>::forward(h, whole.data(), B, T, G, g, hd, kRope);
  for (int c : {1, 2, 3}) {
    const auto ch = context::Chunks::of(T, c);
    for (int r = 0; r < c; ++r) {
      std::vector<double> mine(static_cast<std::size_t>(B * ch.local() * row));
      for (Index b = 0; b < B; ++b)
        for (Index t = 0; t < ch.local(); ++t)
          std::copy_n(full.begin() + (b * T + ch.position(r, t)) * row, row, mine.begin() + (b * ch.local() + t) * row);
      ops::Rotary<Host>::forward(h, mine.data(), B, ch.local(), G, g, hd, kRope, ch.positions(r));
      CHECK_MESSAGE(row_error(mine, whole, ch, r, row, B) == 0.0, "context ", c, ", rank ", r);
      ops::Rotary<Host>::backward(h, mine.data(), B, ch.local(), G, g, hd, kRope, ch.positions(r));  // turned back
      double back = 0;
      for (Index b = 0; b < B; ++b)
        for (Index t = 0; t < ch.local(); ++t)
          for (Index k = 0; k < row; ++k)
            back = test::worse(back, std::abs(mine[static_cast<std::size_t>((b * ch.local() + t) * row + k)] -
                                              full[static_cast<std::size_t>((b * T + ch.position(r, t)) * row + k)]));
      CHECK(back <= 1e-15 * 8);  // a rotation and its inverse: a few roundings of numbers below 8
    }
  }
  const ops::Positions two = context::Chunks::of(T, 3).positions(1);  // chunks 1 and 4 of 6, 4 tokens each
  CHECK(two.at(0) == 4);
  CHECK(two.at(3) == 7);
  CHECK(two.at(4) == 16);
  CHECK(two.at(7) == 19);
}

TEST_CASE("learned positions at a context rank's positions equal the whole sequence's, rows and table gradient") {
  // Exact: each row adds its own position's table row, and each table row's gradient is the same
  // sum over the batch, on whichever rank holds that position.
  const Index B = 2, T = 24, C = 8;
  const std::vector<double> x = test::normals(static_cast<std::size_t>(B * T * C), 6),
                            table = test::normals(static_cast<std::size_t>(T * C), 7),
                            dy = test::normals(static_cast<std::size_t>(B * T * C), 8);
  std::vector<double> whole = x, dwhole(table.size(), 0.0);
  host::position_forward(whole.data(), table.data(), B, T, C, 0);
  host::position_backward(dwhole.data(), dy.data(), B, T, C, 0);
  for (int c : {2, 3}) {
    const auto ch = context::Chunks::of(T, c);
    std::vector<double> dtable(table.size(), 0.0);
    for (int r = 0; r < c; ++r) {
      std::vector<double> mine(static_cast<std::size_t>(B * ch.local() * C)), dmine(mine.size());
      for (Index b = 0; b < B; ++b)
        for (Index t = 0; t < ch.local(); ++t) {
          std::copy_n(x.begin() + (b * T + ch.position(r, t)) * C, C, mine.begin() + (b * ch.local() + t) * C);
          std::copy_n(dy.begin() + (b * T + ch.position(r, t)) * C, C, dmine.begin() + (b * ch.local() + t) * C);
        }
      host::position_forward(mine.data(), table.data(), B, ch.local(), C, ch.positions(r));
      host::position_backward(dtable.data(), dmine.data(), B, ch.local(), C, ch.positions(r));
      CHECK_MESSAGE(row_error(mine, whole, ch, r, C, B) == 0.0, "context ", c, ", rank ", r);
    }
    CHECK_MESSAGE(dtable == dwhole, "context ", c);
  }
}
