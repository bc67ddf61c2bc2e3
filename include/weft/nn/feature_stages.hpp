// The first and last stages of a model whose inputs and outputs are vectors at each position, not
// tokens (a diffusion transformer's patches, a vision model's, audio frames, a regression): nn::
// StagedModel's Embedding and Head for such a model, reading the fields of its batch (nn/batch.hpp)
// that their Field parameters name (a pointer to a member of the model's Inputs, a span of T).
//
//   FeatureEmbeddingStage   the batch's field (B/dp, T, F) -> x (B, T, C) in the stream layout A:
//                           x = rows W^T + b on the rows the rank holds, W (C, F) and b (C)
//                           replicated on every rank; no collective
//   MseHeadStage            x (B, T, C) in A -> the final norm, pred = x W^T + b with W (F, C), b (F)
//                           replicated, and the mean squared error against the batch's field
//                           (B/dp, T, F): sum over every element of (pred - target)^2 / (B T F);
//                           where the batch is padded (nn/padding.hpp), over the valid rows only:
//                           / (valid rows of the global batch x F)
//
// Both work on the rows of the stream a rank holds (row_positions): every row on one rank; a
// context rank's two chunks under context parallelism (Cx); a slice of those over the tensor group
// under sequence parallelism (SP). The projections' weights are replicated and each rank adds the
// gradient of its own rows: Partial on tensor under SP (replicated_param_grad, reduced once per step
// by the data-parallel step, as a position table's), and over the context group with the other
// gradients. The loss's sum is all-reduced over data, over context (its rows), and over tensor
// under SP (its slice), never where the ranks hold the same rows (tensor without SP).
//
// defines: nn::row_positions, nn::take_rows, nn::FeatureEmbeddingStage, nn::MseHeadStage
#pragma once

#include <array>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "weft/context/attention.hpp"
#include "weft/context/chunks.hpp"
#include "weft/core/error.hpp"
#include "weft/nn/batch.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/layernorm.hpp"
#include "weft/nn/padding.hpp"
#include "weft/nn/param.hpp"
#include "weft/nn/roles.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/nn/stream.hpp"
#include "weft/ops/all.hpp"
#include "weft/ops/squared_error.hpp"

namespace weft::nn {

// The positions in the whole sequence of T of the Tl rows a rank holds of a stream in layout A:
// a context rank's two chunks where A shards the sequence over context (context::Chunks), of
// those its slice over tensor where A shards them there too (sequence parallelism), else 0 .. T-1.
template <LayoutType A>
ops::Positions row_positions(const Spread& s, std::int64_t T, std::int64_t Tl) {
  const std::int64_t first = IsShard<typename A::tensor> ? s.tensor_index * Tl : 0;
  if constexpr (IsShard<typename A::context>)
    return context::Chunks::of(T, s.context_degree).positions(s.context_index).from(first);
  else return first;
}

// out (B, Tl, F) = the rows of all (B, T, F) at positions pos, on the device (a copy per run of
// consecutive positions: at most two a sample).
template <class E, class D>
void take_rows(D& dev, E* out, const E* all, std::int64_t B, std::int64_t T, std::int64_t F, ops::Positions pos,
               std::int64_t Tl) {
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < Tl;) {
      const std::int64_t run = t < pos.split ? std::min(Tl, pos.split) - t : Tl - t;
      ops::Memory<D>::copy(dev, out + (b * Tl + t) * F, all + (b * T + pos.at(t)) * F, run * F);
      t += run;
    }
}

namespace detail {
// The class of a pointer to member's type: Inputs for &Inputs::field.
template <class P>
struct member_class;
template <class C, class V>
struct member_class<V C::*> {
  using type = C;
};
template <class P>
using member_class_t = typename member_class<P>::type;

// The field Field of batch `in`, (B/dp, T, F) values of T, and T, checked whole.
template <auto Field, class E, class Batch>
std::span<const E> field_of(const Batch& in, int data_degree, std::int64_t F, std::int64_t& seq,
                            const std::string& where) {
  const std::span<const E> all = in.*Field;
  const std::int64_t local = in.batch / data_degree;
  if (local < 1 || F < 1 || static_cast<std::int64_t>(all.size()) % (local * F) != 0)
    throw Error(where, cat("a field of ", all.size(), " values for ", local, " samples of ", F, " features a position"),
                "pass (batch / data degree) x positions x features values");
  seq = static_cast<std::int64_t>(all.size()) / (local * F);
  return all;
}
}  // namespace detail

template <Floating T, bool SP, auto Field, class D = Host, context::Choice Cx = context::None>
class FeatureEmbeddingStage {
  static constexpr bool cp = context::Kind<Cx>;

 public:
  using A = typename stream<SP, cp>::layout;
  using S = master_t<T>;

  struct Ctx {
    Allocation rows;     // (B/dp, Tl, F): the rank's input rows, for dW
    std::int64_t n = 0;  // B/dp Tl
  };

  Param<T, Replicated, replicated_param_grad<A>, D> weight;  // (C, F)
  Param<T, Replicated, replicated_param_grad<A>, D> bias;    // (C)

  FeatureEmbeddingStage() = default;
  // F features a position onto a stream of width C; parameter ids 0 (weight, normal(0, init_std))
  // and 1 (bias, zeros).
  FeatureEmbeddingStage(D& dev, std::int64_t F, std::int64_t C, const Spread& s, std::uint64_t seed, double init_std)
      : weight(dev, {C, F}, s, 0, {Init::normal, init_std}, seed, Decay::yes),
        bias(dev, {C}, s, 1, {Init::zeros}, seed, Decay::no) {}

  std::int64_t features() const { return weight.value.global_shape()[1]; }
  std::int64_t width() const { return weight.value.global_shape()[0]; }

  // The batch's field (B/dp, T, F) -> x (B, T, C) in A, the rank's rows.
  template <class Batch, AxisComms M>
  Tensor<T, A, D> forward(Ctx& ctx, const Batch& in, M&) {
    D& dev = weight.value.dev();
    const Spread& s = weight.value.spread();
    const std::int64_t F = features(), C = width();
    std::int64_t Tn = 0;
    const auto all = detail::field_of<Field, T>(in, s.data_degree, F, Tn, "FeatureEmbeddingStage::forward");
    auto x = Tensor<T, A, D>::empty(dev, {in.batch, Tn, C}, s, Category::activations);
    const std::int64_t Bl = x.local_shape()[0], Tl = x.local_shape()[1];
    ctx.n = Bl * Tl;
    ctx.rows = dev.allocate(ctx.n * F * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    auto* rows = static_cast<T*>(ctx.rows.data());
    take_rows(dev, rows, all.data(), Bl, Tn, F, row_positions<A>(s, Tn, Tl), Tl);
    ops::Gemm<D>::run(dev, Trans::no, Trans::yes, ctx.n, C, F, S(1), rows, F, weight.value.data(), F, S(0), x.data(),
                      C);
    ops::Bias<D>::add(dev, x.data(), bias.value.data(), ctx.n, C);
    return x;
  }

  // dx (B, T, C) in A: dW += dx^T rows, db += the sum of dx's rows.
  template <AxisComms M>
  void backward(Ctx& ctx, const Tensor<T, A, D>& dx, M&) {
    const std::int64_t F = features(), C = width();
    ops::Gemm<D>::run(dx.dev(), Trans::yes, Trans::no, C, F, ctx.n, S(1), dx.data(), C,
                      static_cast<const T*>(ctx.rows.data()), F, S(1), weight.grad.data(), F);
    ops::Bias<D>::backward(dx.dev(), bias.grad.data(), dx.data(), ctx.n, C);
    ctx = Ctx{};
  }

  static void comm_rows(std::vector<CommRow>& out, const Shape&, const Spread&, std::int64_t) {
    out.push_back({"features -> stream (replicated projection, the rank's rows)", "batch", A::name(), {}, {}});
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    f(prefix + "in_proj.weight", weight);
    f(prefix + "in_proj.bias", bias);
  }
};

// Norm: the final norm's layer over the rank's rows (LayerNorm by default; any layer with
// forward(ctx, x) and backward(ctx, dy), or forward(ctx, x, mesh) and backward(ctx, dy, mesh) where
// it reads the model's side input, as DiT's final adaLN does; built by the stage from (dev, C,
// spread, first id, seed), or passed in built).
template <Floating T, bool SP, auto Field, class D = Host, class Norm = LayerNorm<T, typename stream<SP>::layout, D>,
          context::Choice Cx = context::None>
class MseHeadStage {
  static constexpr bool cp = context::Kind<Cx>;
  using Local = typename stream<SP>::layout;  // the norm's layout (a context rank's rows under Cx)
  // Whether the batch whose field the targets are is padded: its valid rows are counted with the
  // loss (one all-reduce of the two).
  static constexpr bool padded = PaddedInputs<detail::member_class_t<decltype(Field)>>;

 public:
  using A = typename stream<SP, cp>::layout;
  using S = master_t<T>;

  struct Ctx {
    typename Norm::Ctx norm;
    Tensor<T, Local, D> xn;  // the projection's input (B, Tl, C), for dW
    Allocation pred;         // (B/dp, Tl, F), then its gradient
    Allocation target;       // (B/dp, Tl, F): the batch's rows the rank holds
    std::int64_t n = 0;      // B/dp Tl
    double count = 0;        // B T F, or the valid rows' F where padded: what the mean is over
  };

  Norm norm;
  Param<T, Replicated, replicated_param_grad<A>, D> weight;  // (F, C)
  Param<T, Replicated, replicated_param_grad<A>, D> bias;    // (F)

  MseHeadStage() = default;
  // Parameter ids: the norm's norm_id and up, the weight out_id (normal(0, init_std)), the bias out_id + 1.
  MseHeadStage(D& dev, std::int64_t C, std::int64_t F, const Spread& s, std::uint64_t seed, std::uint64_t norm_id,
               std::uint64_t out_id, double init_std)
      : MseHeadStage(Norm(dev, C, s, norm_id, seed), dev, C, F, s, seed, out_id, init_std) {}

  // The same with a norm built by the caller (one whose constructor needs more than the width).
  MseHeadStage(Norm n, D& dev, std::int64_t C, std::int64_t F, const Spread& s, std::uint64_t seed,
               std::uint64_t out_id, double init_std)
      : norm(std::move(n)),
        weight(dev, {F, C}, s, out_id, {init_std > 0 ? Init::normal : Init::zeros, init_std}, seed, Decay::yes),
        bias(dev, {F}, s, out_id + 1, {Init::zeros}, seed, Decay::no) {}

  std::int64_t features() const { return weight.value.global_shape()[0]; }
  std::int64_t width() const { return weight.value.global_shape()[1]; }

  // x (B, T, C) in A and the batch's field (B/dp, T, F) -> the mean squared error over the global
  // batch (its valid rows where padded). With Mode::infer nothing is kept.
  template <class Batch, AxisComms M>
  double forward(Ctx& ctx, const Tensor<T, A, D>& x, const Batch& in, M& mesh, Mode mode = Mode::train) {
    static_assert(!padded || PaddedMesh<M>,
                  "MseHeadStage: the batch is padded but the mesh carries no lengths; run the head in an "
                  "nn::StagedModel (it hands a padded model's head its lengths: nn::StageMesh)");
    D& dev = x.dev();
    const Spread& s = x.spread();
    const std::int64_t F = features(), C = width();
    std::int64_t Tn = 0;
    const auto all = detail::field_of<Field, T>(in, s.data_degree, F, Tn, "MseHeadStage::forward");
    if (Tn != x.global_shape()[1])
      throw Error("MseHeadStage::forward", cat("targets of ", Tn, " positions for a stream of ", x.global_shape()[1]),
                  "pass one target vector per position of the stream");
    Shape g = x.global_shape();
    if constexpr (cp) g[1] /= s.context_degree;  // the rank's rows, as a sequence of their own
    const auto xl = Tensor<T, Local, D>::view(dev, const_cast<T*>(x.data()), g, s);
    typename Norm::Ctx scratch;
    auto xn = norm_forward(mode == Mode::train ? ctx.norm : scratch, xl, mesh);
    const std::int64_t Bl = xn.local_shape()[0], Tl = xn.local_shape()[1], n = Bl * Tl;
    Allocation pred = dev.allocate(n * F * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    Allocation target = dev.allocate(n * F * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    auto* p = static_cast<T*>(pred.data());
    auto* y = static_cast<T*>(target.data());
    take_rows(dev, y, all.data(), Bl, Tn, F, row_positions<A>(s, Tn, Tl), Tl);
    ops::Gemm<D>::run(dev, Trans::no, Trans::yes, n, F, C, S(1), xn.data(), C, weight.value.data(), C, S(0), p, F);
    ops::Bias<D>::add(dev, p, bias.value.data(), n, F);
    std::array<double, padded ? 2 : 1> total{};  // the sum of squares (and the valid rows' elements)
    if constexpr (padded) {
      // A padded row's prediction is its own target: no error, no gradient.
      const double valid = static_cast<double>(valid_rows(
          mesh.host_lengths(), row_positions<A>(s, Tn, Tl), Tl, [&](std::int64_t b, std::int64_t t, std::int64_t rows) {
            ops::Memory<D>::copy(dev, y + (b * Tl + t) * F, p + (b * Tl + t) * F, rows * F);
          }));
      total[1] = valid * static_cast<double>(F);
    }
    total[0] = ops::SquaredError<D>::sum(dev, p, y, n * F);
    mesh.comm(Axis::data).all_reduce(std::span<double>(total));
    if constexpr (cp) mesh.comm(Axis::context).all_reduce(std::span<double>(total));
    if constexpr (SP) mesh.comm(Axis::tensor).all_reduce(std::span<double>(total));
    const double count =
        padded ? total.back() : static_cast<double>(in.batch) * static_cast<double>(Tn) * static_cast<double>(F);
    if (mode == Mode::train) {
      ctx.xn = std::move(xn);
      ctx.pred = std::move(pred);
      ctx.target = std::move(target);
      ctx.n = n;
      ctx.count = count;
    }
    return total[0] / count;
  }

  // -> dx (B, T, C) in A; accumulates the projection's and the norm's gradients. grad_scale
  // multiplies every gradient (1/k when accumulating k micro-batches).
  template <AxisComms M>
  Tensor<T, A, D> backward(Ctx& ctx, double grad_scale, M& mesh) {
    D& dev = ctx.xn.dev();
    const std::int64_t F = features(), C = width();
    auto* dp = static_cast<T*>(ctx.pred.data());  // dpred = scale 2 (pred - target) / count, in place
    ops::SquaredError<D>::backward(dev, dp, dp, static_cast<const T*>(ctx.target.data()), ctx.n * F,
                                   static_cast<S>(grad_scale / ctx.count));
    ops::Gemm<D>::run(dev, Trans::yes, Trans::no, F, C, ctx.n, S(1), dp, F, ctx.xn.data(), C, S(1), weight.grad.data(),
                      C);
    ops::Bias<D>::backward(dev, bias.grad.data(), dp, ctx.n, F);
    auto dxn = Tensor<T, Local, D>::empty(dev, ctx.xn.global_shape(), ctx.xn.spread(), Category::activations);
    ops::Gemm<D>::run(dev, Trans::no, Trans::no, ctx.n, C, F, S(1), dp, F, weight.value.data(), C, S(0), dxn.data(), C);
    auto dx = [&] {
      if constexpr (requires { norm.backward(ctx.norm, dxn, mesh); }) return norm.backward(ctx.norm, dxn, mesh);
      else return norm.backward(ctx.norm, dxn);
    }();
    ctx = Ctx{};
    Shape g = dx.global_shape();
    if constexpr (cp) g[1] *= dx.spread().context_degree;
    return Tensor<T, A, D>::relabel(std::move(dx), g);
  }

  // The stage's rows of the model's plan (describe.hpp): the loss's sum (and the valid rows' count
  // where padded), all-reduced where ranks hold different rows.
  template <class Config>
  static void comm_rows(std::vector<CommRow>& out, const Config&, const Shape&, const Spread& s, std::int64_t) {
    out.push_back({"norm, projection (replicated, the rank's rows)", A::name(), "prediction", {}, {}});
    CommRow loss{padded ? "mean squared error (sum and valid rows over the global batch)"
                        : "mean squared error (sum over the global batch)",
                 "prediction",
                 "loss",
                 {},
                 {}};
    const std::int64_t bytes = padded ? 16 : 8;
    loss.forward.push_back(detail::reduction(Axis::data, s.data_degree, bytes));
    if constexpr (cp) loss.forward.push_back(detail::reduction(Axis::context, s.context_degree, bytes));
    if constexpr (SP) loss.forward.push_back(detail::reduction(Axis::tensor, s.tensor_degree, bytes));
    out.push_back(std::move(loss));
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    norm.for_each_param(prefix + "norm", f);
    f(prefix + "out_proj.weight", weight);
    f(prefix + "out_proj.bias", bias);
  }

 private:
  template <class M>
  Tensor<T, Local, D> norm_forward(typename Norm::Ctx& c, const Tensor<T, Local, D>& x, M& mesh) {
    if constexpr (requires { norm.forward(c, x, mesh); }) return norm.forward(c, x, mesh);
    else return norm.forward(c, x);
  }
};

}  // namespace weft::nn
