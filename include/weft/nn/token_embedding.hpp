// TokenEmbeddingStage: the first stage of a decoder whose positions live inside its attention
// (rotary, as Llama's): the vocab-parallel token table alone, without learned positions.
//
//   tokens (B/dp, T) int32 -> x (B, T, C) in the stream layout A (Replicate, or Shard<1> under SP)
//   wte (Vp, C) Shard<0> on tensor (vocab-parallel): each rank looks up its rows (Partial), and
//   Leave (all-reduce, or reduce-scatter under SP) sums them into the stream
//
// With context parallelism (Cx = context::Ring or context::AllGather) the stream is the context
// rank's rows (T / c, two chunks): the stage looks up the tokens at those rows' positions, taken
// from the whole sequences (context::Chunks::rows), and keeps them for its backward.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "weft/context/attention.hpp"
#include "weft/nn/batch.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/embedding.hpp"
#include "weft/nn/stream.hpp"

namespace weft::nn {

template <Floating T, bool SP, class D = Host, context::Choice Cx = context::None>
class TokenEmbeddingStage {
  static constexpr bool cp = context::Kind<Cx>;

 public:
  using A = typename stream<SP, cp>::layout;
  using Leave = typename stream<SP>::leave;

  struct Ctx {
    typename VocabParallelEmbedding<T, D>::Ctx wte;
    std::vector<std::int32_t> rows;  // context parallelism: the tokens of this rank's rows (B/dp, T/c)
  };

  VocabParallelEmbedding<T, D> wte;  // (Vp, C); a tied head reads it too

  TokenEmbeddingStage() = default;
  // The table's parameter id is 0.
  TokenEmbeddingStage(D& dev, std::int64_t padded_vocab, std::int64_t C, const Spread& s, std::uint64_t seed,
                      double init_std)
      : wte(dev, padded_vocab, C, s, 0, seed, init_std) {}

  // The batch's tokens (B/dp, T) -> x (B, T, C) in A (a context rank's rows under Cx).
  template <AxisComms M>
  Tensor<T, A, D> forward(Ctx& ctx, const MicroBatch& in, M& mesh) {
    const std::int64_t seq = seq_of(in, wte.weight.value.spread().data_degree);
    if constexpr (!cp) return Leave::forward(wte.forward(ctx.wte, in.tokens, in.batch, seq), mesh);
    else return lookup_rows<A, Leave>(wte, ctx.wte, ctx.rows, in.tokens, in.batch, seq, mesh);
  }

  template <AxisComms M>
  void backward(Ctx& ctx, const Tensor<T, A, D>& dx, M& mesh) {
    if constexpr (!cp) wte.backward(ctx.wte, Leave::backward(dx, mesh));  // (B, T, C) Replicate
    else lookup_rows_backward<Leave>(wte, ctx.wte, ctx.rows, dx, mesh);
  }

  static void comm_rows(std::vector<CommRow>& out, const Shape& act, const Spread& s, std::int64_t e) {
    out.push_back(
        detail::pair_row<Leave>("embedding (vocab-parallel) -> stream", detail::context_rows<cp>(act, s), s, e));
  }

  static std::string tied_name() { return "wte"; }
  auto& tied_table() { return wte.weight; }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    wte.for_each_param(prefix + "wte", f);
  }
};

}  // namespace weft::nn
