// Embeddings.
//
// VocabParallelEmbedding: the table (Vp, C) is split by vocabulary rows over the tensor axis
// (Shard<0>); rank r holds rows [r Vp/tp, (r+1) Vp/tp). A token's row is looked up by the rank that
// holds it, the others contribute zeros, so the output (B, T, C) is Partial. Its gradient (the
// gradient of a Partial activation, Replicate) is scattered into the local rows, serially in token
// order (deterministic). Vp is the vocabulary padded to a multiple of the tensor degree.
//
// PositionEmbedding: a learned (T, C) table, Replicate, added to the residual stream in layout A
// (act::Full, or act::Sequence: rank r adds positions [r T/tp, (r+1) T/tp)). Under Sequence its gradient
// is a partial sum over sequence slices: Partial on the tensor axis, reduced once per step.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "weft/comm/redistribute.hpp"
#include "weft/context/chunks.hpp"
#include "weft/nn/param.hpp"
#include "weft/nn/roles.hpp"
#include "weft/ops/all.hpp"

namespace weft::nn {

// The vocabulary padded to a multiple of the tensor degree.
constexpr std::int64_t padded_vocab(std::int64_t vocab, int tensor_degree) {
  return (vocab + tensor_degree - 1) / tensor_degree * tensor_degree;
}

template <Floating T, class D = Host>
class VocabParallelEmbedding {
 public:
  struct Ctx {
    std::span<const std::int32_t> tokens;  // (B/dp, T), owned by the caller
  };

  Param<T, Layout<Replicate, Shard<0>>, Layout<Replicate, Shard<0>>, D> weight;  // (Vp, C)

  VocabParallelEmbedding() = default;
  VocabParallelEmbedding(D& dev, std::int64_t padded_vocab, std::int64_t C, const Spread& s, std::uint64_t id,
                         std::uint64_t seed, double init_std)
      : weight(dev, {padded_vocab, C}, s, id, {Init::normal, init_std}, seed, Decay::no) {}

  std::int64_t rows() const { return weight.value.local_shape()[0]; }
  std::int64_t begin() const { return weight.value.spread().tensor_index * rows(); }

  // tokens (B/dp, T) -> (B, T, C) Partial.
  // tokens: in the device's memory.
  Tensor<T, act::Partial, D> forward(Ctx& ctx, std::span<const std::int32_t> tokens, std::int64_t batch,
                                     std::int64_t seq) {
    const std::int64_t C = weight.value.local_shape()[1];
    auto out = Tensor<T, act::Partial, D>::empty(weight.value.dev(), {batch, seq, C}, weight.value.spread(),
                                                 Category::activations);
    ops::Embedding<D>::forward(out.dev(), out.data(), tokens.data(), weight.value.data(), out.numel() / C, C, begin(),
                               begin() + rows());
    ctx.tokens = tokens;
    return out;
  }

  // dy (B, T, C) Replicate: accumulates into this rank's rows.
  void backward(Ctx& ctx, const Tensor<T, act::Full, D>& dy) {
    const std::int64_t C = weight.value.local_shape()[1];
    ops::Embedding<D>::backward(dy.dev(), weight.grad.data(), dy.data(), ctx.tokens.data(), dy.numel() / C, C, begin(),
                                begin() + rows());
    ctx = Ctx{};
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    f(prefix, weight);
  }
};

template <Floating T, LayoutType A, class D = Host>
class PositionEmbedding {
 public:
  Param<T, Replicated, replicated_param_grad<A>, D> weight;  // (T, C)

  PositionEmbedding() = default;
  PositionEmbedding(D& dev, std::int64_t seq, std::int64_t C, const Spread& s, std::uint64_t id, std::uint64_t seed,
                    double init_std)
      : weight(dev, {seq, C}, s, id, {Init::normal, init_std}, seed, Decay::no) {}

  // x (B, T, T/tp or T/c, C) += the rows of this rank's positions (in place: nothing to save).
  void forward(Tensor<T, A, D>& x) const {
    ops::Position<D>::forward(x.dev(), x.data(), weight.value.data(), x.local_shape()[0], x.local_shape()[1],
                              x.local_shape()[2], positions(x));
  }
  // Accumulates dy's rows into the gradient of this rank's positions.
  void backward(const Tensor<T, A, D>& dy) {
    ops::Position<D>::backward(dy.dev(), weight.grad.data(), dy.data(), dy.local_shape()[0], dy.local_shape()[1],
                               dy.local_shape()[2], positions(dy));
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    f(prefix, weight);
  }

 private:
  // The positions this rank holds: a context rank's two chunks where the context axis shards the
  // sequence (context::Chunks), its slice under sequence parallelism's Shard<1> (of those rows, when
  // both shard it), else 0 .. T - 1.
  static ops::Positions positions(const Tensor<T, A, D>& x) {
    const std::int64_t first = IsShard<typename A::tensor> ? x.spread().tensor_index * x.local_shape()[1] : 0;
    if constexpr (IsShard<typename A::context>)
      return context::Chunks::of(x.global_shape()[1], x.spread().context_degree)
          .positions(x.spread().context_index)
          .from(first);
    else return first;
  }
};

// The first stages' lookup of a context rank's rows (context parallelism, docs/context.md): the
// tokens at the rows' positions (context::Chunks::rows of the whole sequences), kept in `rows` for
// the backward; the table's output brought to the stream by Leave (B, T/c, C) and relabelled as the
// rows of (B, T, C) in layout A (the same storage).
template <LayoutType A, class Leave, Floating T, class D, AxisComms M>
Tensor<T, A, D> lookup_rows(VocabParallelEmbedding<T, D>& wte, typename VocabParallelEmbedding<T, D>::Ctx& ctx,
                            std::vector<std::int32_t>& rows, std::span<const std::int32_t> tokens, std::int64_t batch,
                            std::int64_t seq, M& mesh) {
  static_assert(D::host_memory, "nn::lookup_rows: context parallelism takes its rows in host memory so far");
  auto& cg = mesh.comm(Axis::context);
  const auto ch = context::Chunks::of(seq, cg.size());
  rows = ch.rows(tokens, cg.rank());
  auto x = Leave::forward(wte.forward(ctx, rows, batch, ch.local()), mesh);
  Shape g = x.global_shape();
  g[1] = seq;
  return Tensor<T, A, D>::relabel(std::move(x), g);
}

// Its backward: dx (the rows of (B, T, C) in A) seen as (B, T/c, C) in Leave's output layout.
template <class Leave, Floating T, class D, LayoutType A, AxisComms M>
void lookup_rows_backward(VocabParallelEmbedding<T, D>& wte, typename VocabParallelEmbedding<T, D>::Ctx& ctx,
                          std::vector<std::int32_t>& rows, const Tensor<T, A, D>& dx, M& mesh) {
  Shape g = dx.global_shape();
  g[1] /= dx.spread().context_degree;
  wte.backward(
      ctx, Leave::backward(Tensor<T, typename Leave::Out, D>::view(dx.dev(), const_cast<T*>(dx.data()), g, dx.spread()),
                           mesh));
  rows = {};
}

}  // namespace weft::nn
