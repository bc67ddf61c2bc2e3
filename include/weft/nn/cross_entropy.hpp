// VocabParallelCrossEntropy<T>: the mean cross-entropy of logits sharded over the vocabulary,
// without ever gathering them (Megatron's vocab-parallel loss).
//
//   logits  (B, T, Vp) Shard<-1> on tensor     rank r holds vocabulary columns [r Vp/tp, (r+1) Vp/tp)
//   rowmax  (B, T)     Replicate on tensor     after an all-reduce (max)
//   stats   (B, T, 2)  Partial on tensor       (sum exp(logit - max), target logit) per rank, then
//                                              one all-reduce (sum) for both
//
// Columns at or beyond the real vocabulary (the padding to a multiple of the tensor degree) are
// masked out of the softmax and get zero gradient. forward() returns the mean loss over the global
// batch (an all-reduce over data) and keeps the logits, row maxima and sums of exponentials in its
// context, as tensors the allocator counts; backward() turns the kept logits into their gradient in
// place (scale (softmax - onehot)), so the logits and their gradient never coexist.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>

#include "weft/comm/redistribute.hpp"
#include "weft/nn/roles.hpp"
#include "weft/ops/all.hpp"

namespace weft::nn {

template <Floating T, class D = Host>
class VocabParallelCrossEntropy {
 public:
  using Rows = Layout<Shard<0>, Replicate>;          // (B, T): one value per position
  using RowStats = Layout<Shard<0>, weft::Partial>;  // (B, T, 2) before the reduction
  using In = act::Features;

  using S = master_t<T>;  // row statistics and the loss

  struct Ctx {
    Tensor<T, In, D> logits;  // (B, T, Vp) Shard<-1>; the gradient after backward()
    Tensor<S, Rows, D> rowmax, sumexp;
    std::span<const std::int32_t> targets;  // (B/dp, T) in the device's memory, owned by the caller
  };

  std::int64_t vocab = 0;  // the real vocabulary (columns beyond it are padding)
  // Context parallelism: the logits are a context rank's rows (T / c of the T positions, in their
  // global shape); the loss sums over the context group too and is the mean over the whole B T.
  bool context_rows = false;

  VocabParallelCrossEntropy() = default;
  explicit VocabParallelCrossEntropy(std::int64_t v) : vocab(v) {}

  // The mean loss over the global batch; keeps what backward needs in ctx (logits moved in).
  template <AxisComms M>
  double forward(Ctx& ctx, Tensor<T, In, D> logits, std::span<const std::int32_t> targets, M& mesh) const {
    D& dev = logits.dev();
    const Spread s = logits.spread();
    const Shape g = logits.global_shape();  // (B, T, Vp)
    const std::int64_t Vl = logits.local_shape()[2], N = logits.numel() / Vl, begin = s.tensor_index * Vl;
    const std::int64_t valid = std::clamp<std::int64_t>(vocab - begin, 0, Vl);
    auto rowmax = Tensor<S, Rows, D>::empty(dev, {g[0], g[1]}, s, Category::activations);
    auto stats = Tensor<S, RowStats, D>::empty(dev, {g[0], g[1], 2}, s, Category::activations);
    ops::CrossEntropy<D>::row_max(dev, rowmax.data(), logits.data(), N, Vl, valid);
    mesh.comm(Axis::tensor).all_reduce(rowmax.span(), ReduceOp::max);
    ops::CrossEntropy<D>::row_stats(dev, stats.data(), logits.data(), rowmax.data(), targets.data(), N, Vl, valid,
                                    begin);
    mesh.comm(Axis::tensor).all_reduce(stats.span(), ReduceOp::sum);
    auto sumexp = Tensor<S, Rows, D>::empty(dev, {g[0], g[1]}, s, Category::activations);
    std::array<double, 1> total{ops::CrossEntropy<D>::loss(dev, sumexp.data(), stats.data(), rowmax.data(), N)};
    mesh.comm(Axis::data).all_reduce(std::span<double>(total));
    if (context_rows) mesh.comm(Axis::context).all_reduce(std::span<double>(total));
    ctx.logits = std::move(logits);
    ctx.rowmax = std::move(rowmax);
    ctx.sumexp = std::move(sumexp);
    ctx.targets = targets;
    return total[0] / positions(s, g);
  }

  // dlogits (B, T, Vp) Shard<-1> = scale / (B T) (softmax - onehot), in place of the kept logits.
  // scale multiplies the gradient (1/k when accumulating k micro-batches; 0 for none).
  Tensor<T, In, D> backward(Ctx& ctx, double scale) const {
    Tensor<T, In, D> d = std::move(ctx.logits);
    const Shape g = d.global_shape();
    const std::int64_t Vl = d.local_shape()[2], N = d.numel() / Vl, begin = d.spread().tensor_index * Vl;
    const std::int64_t valid = std::clamp<std::int64_t>(vocab - begin, 0, Vl);
    ops::CrossEntropy<D>::backward(d.dev(), d.data(), d.data(), ctx.rowmax.data(), ctx.sumexp.data(),
                                   ctx.targets.data(), N, Vl, valid, begin,
                                   static_cast<S>(scale / positions(d.spread(), g)));
    ctx = Ctx{};
    return d;
  }

  static std::string name() { return "VocabParallelCrossEntropy"; }

 private:
  // B T: the positions the mean is over.
  double positions(const Spread& s, const Shape& g) const {
    return static_cast<double>(g[0] * g[1]) * (context_rows ? s.context_degree : 1);
  }
};

}  // namespace weft::nn
