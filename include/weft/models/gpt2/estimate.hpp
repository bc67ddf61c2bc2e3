// GPT-2's step time in closed form (estimate::Work from its sizes and types): the GEMMs, the
// attention core, the elementwise ops, the buffers of the step's replay (replay.hpp) and the
// collectives (describe's rows, the model walked on the Meta device), for a gpt2::Model<P, SP, R> under data-parallel
// Strategy; and a pipelined step from it (estimate::pipeline_seconds_of). cost/measure_time.hpp measures the same Work
// for any model on the Meta device; tests/cost/measure.cpp holds the two equal for GPT-2.
#pragma once

#include <cstdint>
#include <string>

#include "weft/cost/time.hpp"
#include "weft/models/gpt2/footprint.hpp"
#include "weft/models/gpt2/replay.hpp"
#include "weft/nn/describe.hpp"

namespace weft::estimate {

// What one rank of a data x tensor mesh (pipe 1) runs in a step of `micro_batches` micro-batches of
// `micro` sequences (global).
template <class Strategy, PrecisionLike P, bool SP = false, recompute::Policy R = recompute::None>
Work work(const gpt2::Config& c, const Spread& s, std::int64_t micro, std::int64_t micro_batches = 1) {
  using T = typename precision_t<P>::compute;
  using G = master_t<T>;
  constexpr bool full = std::same_as<R, recompute::Full>, selective = std::same_as<R, recompute::Selective>;
  constexpr bool shard_params = IsShard<typename Strategy::params>;
  constexpr bool shard_grads = IsShard<typename Strategy::grads>;
  constexpr bool shard_state = IsShard<typename Strategy::state>;
  const std::int64_t mb = micro_batches < 1 ? 1 : micro_batches;
  const std::int64_t C = c.width, tp = s.tensor_degree, dp = s.data_degree;
  const std::int64_t N = micro / dp * c.seq, Vl = nn::padded_vocab(c.vocab, s.tensor_degree) / tp;
  Work w;
  w.memory = footprint::step<Strategy, P, SP, R>(c, s, micro, mb);

  // The Linear layers (nn/linear.hpp; W is (out, in)): forward y = x W^T (N, out, in); backward
  // dx = dy W (N, in, out) and dW = dy^T x (out, in, N). Under FP8 each reads float8 casts of its
  // two operands, op(A) (m, k) and op(B) (n, k): m k + n k elements cast.
  constexpr bool fp8 = precision_t<P>::gemms::fp8;
  const std::int64_t forwards = c.layers * mb * (full ? 2 : 1), backwards = c.layers * mb;
  for (const auto& [in, out] :
       {std::pair{C, 3 * C / tp}, std::pair{C / tp, C}, std::pair{C, 4 * C / tp}, std::pair{4 * C / tp, C}}) {
    for (const Gemm& g : {Gemm{N, out, in, forwards, false, true, fp8}, Gemm{N, in, out, backwards, false, false, fp8},
                          Gemm{out, in, N, backwards, true, false, fp8}}) {
      w.gemms.push_back(g);
      if (fp8) w.elementwise.fp8_cast += static_cast<double>(g.count) * static_cast<double>(g.cast_elements());
    }
  }
  // The tied LM head (nn/stages.hpp): logits (N, Vl, C), the table's gradient and the input's.
  w.gemms.push_back({N, Vl, C, mb, false, true});
  w.gemms.push_back({Vl, C, N, mb, true, false});
  w.gemms.push_back({N, C, Vl, mb, false, false});

  // The attention core per block: QK^T and PV over the causal half, forward once (twice under
  // Selective or Full recompute), backward twice the forward.
  const double hd = static_cast<double>(C / c.heads), heads = static_cast<double>(c.heads / tp);
  const double core =
      2.0 * static_cast<double>(micro / dp) * heads * static_cast<double>(c.seq) * static_cast<double>(c.seq + 1) * hd;
  w.attention_flops = static_cast<double>(c.layers * mb) * core * ((selective || full ? 2 : 1) + 2);

  // Elementwise ops: GELU on the MLP's hidden (B/dp, T, 4C/tp), LayerNorm on the stream (twice per
  // block and ln_f), a recomputed forward counting half of a forward-and-backward; the
  // cross-entropy on the logits; AdamW on the range this rank updates.
  const double redo = full ? 1.5 : 1.0, blocks = static_cast<double>(c.layers * mb);
  const double stream_rows = static_cast<double>(micro / dp) * static_cast<double>(SP ? c.seq / tp : c.seq);
  w.elementwise.gelu = static_cast<double>(N) * static_cast<double>(4 * C / tp) * blocks * redo;
  w.elementwise.layernorm = stream_rows * static_cast<double>(C) * (2 * blocks * redo + static_cast<double>(mb));
  w.elementwise.cross_entropy = static_cast<double>(N) * static_cast<double>(Vl) * static_cast<double>(mb);
  const footprint::Memory& held = w.memory.after;
  w.elementwise.adamw =
      static_cast<double>(held.of(Category::optimizer_state)) / (2.0 * static_cast<double>(sizeof(optim::state_t<T>)));
  w.allocated_bytes = w.memory.allocated.of(Category::activations) + w.memory.allocated.of(Category::communication);

  // The model's collectives (tensor axis, the loss's all-reduce on data), per micro-batch and per step.
  auto add = [&](const CommStep& st, std::int64_t count) {
    if (st.collective == Collective::none || st.collective == Collective::slice || st.collective == Collective::embed ||
        st.collective == Collective::keep_one)
      return;
    w.comms.push_back({st.collective, st.axis, st.degree, std::max(st.bytes_in, st.bytes_out), count});
  };
  // Every block's rows are the same: the model is walked built with one block (on the Meta device,
  // no memory), whose rows count c.layers times.
  gpt2::Config one = c;
  one.layers = 1;
  const std::string block = gpt2::Spec<P, SP, R, Meta<Host>>::block_name(0);
  for (const nn::CommRow& row : nn::describe_rows<gpt2::Model<P, SP, R, Meta<Host>>>(one, micro, s)) {
    const std::int64_t times = row.layer.starts_with(block) ? c.layers : 1;  // "h0.attn.qkv", "h0: ln1 -> attn"
    for (const CommStep& st : row.forward) add(st, mb * times);
    for (const CommStep& st : row.backward) add(st, mb * times);
  }
  // Under SP the gradients Partial on tensor (the LayerNorms', the positions'), packed into one
  // all-reduce per step: of this rank's reduction range where gradients are sharded (ZeRO-2, FSDP),
  // as the memory replay counts it.
  if (SP && tp > 1) {
    footprint::Ledger scratch{footprint::Memory{}};
    const footprint::detail::StepReplay<Strategy, P, SP, R, optim::AdamW> replay(c, s, micro, scratch);
    w.comms.push_back({Collective::all_reduce, Axis::tensor, static_cast<int>(tp),
                       replay.partial_grads(footprint::Holds::all(c)) * static_cast<std::int64_t>(sizeof(G)), 1});
  }
  // The data-parallel protocol, per unit (optim/data_parallel.hpp).
  const std::int64_t e = sizeof(T), g = sizeof(G);
  const footprint::Units units = gpt2::units(c, s);
  const auto pad = [&](std::int64_t n) { return footprint::padded(n, dp); };
  struct Unit {
    std::int64_t n, count;
    bool regathered;  // gathered again for the backward (the blocks; the embedding and the head stay gathered)
  };
  const std::array<Unit, 3> protocol{
      {{pad(units.embedding()), 1, false}, {pad(units.block), c.layers, true}, {pad(units.head), 1, false}}};
  const auto d = static_cast<int>(dp);
  for (const Unit& u : protocol) {
    if constexpr (shard_grads) w.comms.push_back({Collective::reduce_scatter, Axis::data, d, u.n * g, u.count * mb});
    else w.comms.push_back({Collective::all_reduce, Axis::data, d, u.n * g, u.count});
    if constexpr (shard_params)
      w.comms.push_back({Collective::all_gather, Axis::data, d, u.n * e, u.count * (u.regathered ? 2 : 1) * mb});
    else if constexpr (shard_state)
      w.comms.push_back({Collective::all_gather, Axis::data, d, u.n * e, u.count});  // the updated values
  }
  // The gradient norm: one 8-byte all-reduce on each axis.
  w.comms.push_back({Collective::all_reduce, Axis::tensor, static_cast<int>(tp), 8, 1});
  w.comms.push_back({Collective::all_reduce, Axis::data, static_cast<int>(dp), 8, 1});
  return w;
}

// GPT-2's pipelined step from its closed forms (work()).
template <class Strategy, PrecisionLike P, bool SP = false, recompute::Policy R = recompute::None>
PipelineTime pipeline_seconds(const gpt2::Config& c, const Spread& s, std::int64_t micro, const pipeline::Table& t,
                              const Rates& r, const Link& pipe) {
  using T = typename precision_t<P>::compute;
  const auto cost = [&](std::int64_t layers, std::int64_t mb) {
    gpt2::Config k = c;
    k.layers = layers;
    return seconds(work<Strategy, P, SP, R>(k, s, micro, mb), r).total();
  };
  const std::int64_t rows = micro / s.data_degree * (SP ? c.seq / s.tensor_degree : c.seq);
  const double message =
      pipe.alpha + static_cast<double>(rows * c.width * static_cast<std::int64_t>(sizeof(T))) * pipe.beta;
  // The tied table's gradient (this rank's slice where gradients are sharded), summed over the
  // first and last pipe ranks.
  const std::int64_t table = footprint::padded(gpt2::units(c, s).table, s.data_degree);
  const std::int64_t tied_bytes = (IsShard<typename Strategy::grads> ? table / s.data_degree : table) *
                                  static_cast<std::int64_t>(sizeof(master_t<T>));
  const double tied = t.p > 1 ? collective_seconds(Collective::all_reduce, 2, tied_bytes, pipe) : 0.0;
  return pipeline_seconds_of(cost, c.layers, t, message, tied);
}

}  // namespace weft::estimate
