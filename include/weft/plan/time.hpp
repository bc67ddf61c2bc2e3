// weft::estimate: the time of a training step, from what the plan knows (the GEMMs, the attention
// core, the bytes a step allocates, the collectives and their bytes, all from the types and sizes)
// and a few rates of the machine:
//
//   GEMMs          each shape's FLOPs over the rate the machine reaches at that shape
//   attention      the core's FLOPs (causal) over its rate
//   elementwise    GELU, LayerNorm, the cross-entropy and AdamW: their elements over each op's rate
//                  (compute-bound on a CPU, so measured per op; bandwidth-bound on a GPU)
//   memory         every other byte: each buffer the step allocates (plan/step.hpp) written once,
//                  where the first touch of fresh memory has its own rate, and read twice
//   collectives    alpha-beta per link: ring (all-reduce 2(n-1) alpha + 2 (n-1)/n S beta, all-gather and
//                  reduce-scatter (n-1) alpha + (n-1)/n S beta) or, for all-reduce, a tree
//                  (2 log2(n) alpha + 2 S beta), whichever is faster, as NCCL picks
//   overlap        none: weft's executors run collectives and compute one after the other
//   pipelines      pipeline_seconds(): the pipe-1 model split by linearity into a block's and the
//                  ends' cost per micro-batch and per step; each virtual stage's forward (a third)
//                  and backward (two thirds; B and W a third each under ZB-H1) run through the
//                  schedule's table (pipeline::simulate, messages alpha + bytes beta on the pipe
//                  link), then each rank's once-a-step part
//
// Rates come from a measurement on the machine (examples/plan_rates.hpp on the host) or from a
// cluster description (weft-plan: peak FLOP/s, HBM bandwidth, intra- and inter-node links).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "weft/models/gpt2/model.hpp"
#include "weft/pipeline/schedule.hpp"
#include "weft/plan/step.hpp"

namespace weft::estimate {

// A link's cost: alpha seconds per message, beta seconds per byte.
struct Link {
  double alpha = 0, beta = 0;
};

// Seconds of one collective over n ranks on link l; bytes: the larger of a rank's input and output.
inline double collective_seconds(Collective c, int n, std::int64_t bytes, const Link& l) {
  if (n <= 1) return 0;
  const double N = n, S = static_cast<double>(bytes);
  switch (c) {
    case Collective::all_reduce: {
      const double ring = 2 * (N - 1) * l.alpha + 2 * (N - 1) / N * S * l.beta;
      const double tree = 2 * std::ceil(std::log2(N)) * l.alpha + 2 * S * l.beta;
      return std::min(ring, tree);
    }
    case Collective::all_gather: case Collective::reduce_scatter: case Collective::all_to_all:
      return (N - 1) * l.alpha + (N - 1) / N * S * l.beta;
    case Collective::send_recv: return l.alpha + S * l.beta;  // one block to the next rank
    default: return 0;
  }
}

// One GEMM shape (m x k times k x n; ta, tb: whether A and B are stored transposed, as the layers
// call it) and how many times a step runs it.
struct Gemm {
  std::int64_t m = 0, n = 0, k = 0, count = 0;
  bool ta = false, tb = false;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// One collective shape on an axis and how many times a step runs it.
struct Comm {
  Collective collective = Collective::none;
  Axis axis = Axis::data;
  int degree = 1;
  std::int64_t bytes = 0, count = 0;
};

// Elements through the ops that cost more than their bytes (forward and backward together).
struct Elementwise {
  double gelu = 0, layernorm = 0, cross_entropy = 0, adamw = 0;
};

// What one rank of a data x tensor mesh (pipe 1) runs in a step of `micro_batches` micro-batches of
// `micro` sequences (global), for a gpt2::Model<P, SP, R> under data-parallel Strategy.
struct Work {
  std::vector<Gemm> gemms;
  double attention_flops = 0;       // the causal core, forward and backward (and recomputed forwards)
  Elementwise elementwise;          // elements through GELU, LayerNorm, cross-entropy, AdamW
  std::int64_t allocated_bytes = 0; // every buffer the step allocates
  std::vector<Comm> comms;
  footprint::StepPeak memory;       // the step's memory plan
};

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
  // dx = dy W (N, in, out) and dW = dy^T x (out, in, N).
  const std::int64_t forwards = c.layers * mb * (full ? 2 : 1), backwards = c.layers * mb;
  for (const auto& [in, out] : {std::pair{C, 3 * C / tp}, std::pair{C / tp, C}, std::pair{C, 4 * C / tp}, std::pair{4 * C / tp, C}}) {
    w.gemms.push_back({N, out, in, forwards, false, true});
    w.gemms.push_back({N, in, out, backwards, false, false});
    w.gemms.push_back({out, in, N, backwards, true, false});
  }
  // The tied LM head (nn/stages.hpp): logits (N, Vl, C), the table's gradient and the input's.
  w.gemms.push_back({N, Vl, C, mb, false, true});
  w.gemms.push_back({Vl, C, N, mb, true, false});
  w.gemms.push_back({N, C, Vl, mb, false, false});

  // The attention core per block: QK^T and PV over the causal half, forward once (twice under
  // Selective or Full recompute), backward twice the forward.
  const double hd = static_cast<double>(C / c.heads), heads = static_cast<double>(c.heads / tp);
  const double core = 2.0 * static_cast<double>(micro / dp) * heads * static_cast<double>(c.seq) *
                      static_cast<double>(c.seq + 1) * hd;
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
  w.elementwise.adamw = static_cast<double>(held.of(Category::optimizer_state)) /
                        (2.0 * static_cast<double>(sizeof(optim::state_t<T>)));
  w.allocated_bytes = w.memory.allocated.of(Category::activations) + w.memory.allocated.of(Category::communication);

  // The model's collectives (tensor axis, the loss's all-reduce on data), per micro-batch and per step.
  auto add = [&](const PlanStep& st, std::int64_t count) {
    if (st.collective == Collective::none || st.collective == Collective::slice || st.collective == Collective::embed ||
        st.collective == Collective::keep_one)
      return;
    w.comms.push_back({st.collective, st.axis, st.degree, std::max(st.bytes_in, st.bytes_out), count});
  };
  for (const nn::PlanRow& row : gpt2::Model<P, SP, R>::plan_rows(c, micro, s)) {
    for (const PlanStep& st : row.forward) add(st, mb);
    for (const PlanStep& st : row.backward) add(st, mb);
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
  const footprint::Units units = footprint::units(c, s);
  const auto pad = [&](std::int64_t n) { return footprint::padded(n, dp); };
  struct Unit {
    std::int64_t n, count;
    bool regathered;  // gathered again for the backward (the blocks; the embedding and the head stay gathered)
  };
  const std::array<Unit, 3> protocol{{{pad(units.embedding()), 1, false},
                                      {pad(units.block), c.layers, true},
                                      {pad(units.head), 1, false}}};
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

// The machine's rates.
struct Rates {
  std::function<double(const Gemm&)> gemm_flops;  // FLOP/s at a shape
  double attention_flops = 0;                      // FLOP/s of the attention core
  Elementwise elements;                            // elements/s of each op, forward and backward
  double bandwidth = 0;                            // bytes/s read or written by a streaming op
  double first_touch = 0;                          // bytes/s allocated and written for the first time
  Link tensor, data;                               // the links of the tensor and data groups
};

struct Breakdown {
  double gemm = 0, attention = 0, elementwise = 0, memory = 0, tensor_comm = 0, data_comm = 0;
  double total() const { return gemm + attention + elementwise + memory + tensor_comm + data_comm; }
};

inline Breakdown seconds(const Work& w, const Rates& r) {
  Breakdown b;
  for (const Gemm& x : w.gemms)
    if (x.count > 0 && x.flops() > 0) b.gemm += static_cast<double>(x.count) * x.flops() / r.gemm_flops(x);
  b.attention = w.attention_flops / r.attention_flops;
  const Elementwise& n = w.elementwise;
  const Elementwise& e = r.elements;
  b.elementwise = n.gelu / e.gelu + n.layernorm / e.layernorm + n.cross_entropy / e.cross_entropy + n.adamw / e.adamw;
  const double bytes = static_cast<double>(w.allocated_bytes);
  b.memory = bytes / r.first_touch + 2 * bytes / r.bandwidth;
  for (const Comm& x : w.comms) {
    const double t = static_cast<double>(x.count) * collective_seconds(x.collective, x.degree, x.bytes,
                                                                        x.axis == Axis::tensor ? r.tensor : r.data);
    (x.axis == Axis::tensor ? b.tensor_comm : b.data_comm) += t;
  }
  return b;
}

// A pipelined step on a data x pipe x tensor mesh.
struct PipelineTime {
  double step = 0;      // the slowest pipe rank: the schedule, its once-a-step part, the tied all-reduce
  double makespan = 0;  // the schedule's forwards, backwards and messages (the simulation)
  double block = 0;     // one block's forward and backward of one micro-batch
  double ends = 0;      // the embedding's and the head's, of one micro-batch
  double message = 0;   // one activation or gradient between neighbouring ranks
  std::vector<double> once;    // per pipe rank: the optimizer, its units' data collectives, the norm
  std::vector<double> bubble;  // per pipe rank: its idle share of the makespan
};

// A pipelined step from its pipe-1 cost: `cost(layers, micro_batches)` is the seconds of a pipe-1
// step of the same model with that many layers and micro-batches (of the run's size). The model's
// cost is linear in its blocks and its micro-batches, so four pipe-1 costs separate a block per
// micro-batch (block), the embedding and head per micro-batch (ends), a block per step and the
// rest per step. Virtual stage s costs its blocks, plus the ends on the last stage; rank r's
// once-a-step part is its blocks', plus the rest where it holds the embedding or the head. Layers
// must divide into the table's p V stages. `message`: one activation's seconds between neighbours;
// `tied`: the tied table's gradient all-reduce over the first and last pipe ranks (0: none).
template <class Cost>
PipelineTime pipeline_seconds_of(Cost&& cost, std::int64_t layers, const pipeline::Table& t, double message, double tied) {
  const double t11 = cost(1, 1), t12 = cost(1, 2), t21 = cost(2, 1), t22 = cost(2, 2);
  PipelineTime out;
  out.block = t22 - t12 - t21 + t11;
  out.ends = t12 - t11 - out.block;
  const double block_once = t21 - t11 - out.block, ends_once = t11 - out.block - out.ends - block_once;
  const int S = t.stages();
  const std::int64_t per_stage = layers / S;
  out.message = message;
  pipeline::StageCosts costs;
  costs.message = out.message;
  for (int st = 0; st < S; ++st) {
    const double pass = static_cast<double>(per_stage) * out.block + (st == S - 1 ? out.ends : 0.0);
    costs.forward.push_back(pass / 3);
    costs.backward.push_back(t.split_weight ? pass / 3 : 2 * pass / 3);
    costs.weight.push_back(t.split_weight ? pass / 3 : 0.0);
  }
  const pipeline::Simulation sim = pipeline::simulate(t, costs);
  out.makespan = sim.makespan;
  for (int rank = 0; rank < t.p; ++rank) {
    const bool ends = rank == 0 || rank == (S - 1) % t.p;
    const double once = static_cast<double>(layers / t.p) * block_once + (ends ? ends_once : 0.0);
    out.once.push_back(once);
    out.bubble.push_back(sim.bubble(rank));
    out.step = std::max(out.step, sim.end[static_cast<std::size_t>(rank)] + once + tied);
  }
  return out;
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
  const double message = pipe.alpha + static_cast<double>(rows * c.width * static_cast<std::int64_t>(sizeof(T))) * pipe.beta;
  // The tied table's gradient (this rank's slice where gradients are sharded), summed over the
  // first and last pipe ranks.
  const std::int64_t table = footprint::padded(footprint::units(c, s).table, s.data_degree);
  const std::int64_t tied_bytes = (IsShard<typename Strategy::grads> ? table / s.data_degree : table) *
                                  static_cast<std::int64_t>(sizeof(master_t<T>));
  const double tied = t.p > 1 ? collective_seconds(Collective::all_reduce, 2, tied_bytes, pipe) : 0.0;
  return pipeline_seconds_of(cost, c.layers, t, message, tied);
}

}  // namespace weft::estimate
