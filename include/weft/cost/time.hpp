// weft::estimate: the time of a training step, from what the plan knows (the GEMMs, the attention
// core, the bytes a step allocates, the collectives and their bytes, all from the types and sizes)
// and a few rates of the machine:
//
//   GEMMs          each shape's FLOPs over the rate the machine reaches at that shape (an FP8
//                  GEMM's at the FP8 rate on a GPU: twice bf16's peak on Hopper)
//   attention      the core's FLOPs (causal) over its rate
//   elementwise    GELU, LayerNorm, the cross-entropy and AdamW: their elements over each op's rate
//                  (compute-bound on a CPU, so measured per op; bandwidth-bound on a GPU); under FP8
//                  (core/float8_gemms.hpp) the float8 casts' elements too (each GEMM operand's amax
//                  pass and cast, priced by their own rate)
//   memory         every other byte: each buffer the step allocates (its plan) written once,
//                  where the first touch of fresh memory has its own rate, and read twice
//   collectives    alpha-beta per link: ring (all-reduce 2(n-1) alpha + 2 (n-1)/n S beta, all-gather and
//                  reduce-scatter (n-1) alpha + (n-1)/n S beta) or, for all-reduce, a tree
//                  (2 log2(n) alpha + 2 S beta), whichever is faster, as NCCL picks; all-to-all
//                  (the expert group's dispatch and combine) as all-gather
//   overlap        none: weft's executors run collectives and compute one after the other
//   pipelines      pipeline_seconds(): the pipe-1 model split by linearity into a block's and the
//                  ends' cost per micro-batch and per step; each virtual stage's forward (a third)
//                  and backward (two thirds; B and W a third each under ZB-H1) run through the
//                  schedule's table (pipeline::simulate, messages alpha + bytes beta on the pipe
//                  link), then each rank's once-a-step part
//
// Rates come from a measurement on the machine (cost/host_rates.hpp on the host) or from a
// cluster description (weft-plan: peak FLOP/s, HBM bandwidth, intra- and inter-node links).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "weft/core/shape.hpp"
#include "weft/cost/ledger.hpp"
#include "weft/layout/transition.hpp"
#include "weft/pipeline/schedule.hpp"

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
    case Collective::all_gather:
    case Collective::reduce_scatter:
    case Collective::all_to_all: return (N - 1) * l.alpha + (N - 1) / N * S * l.beta;
    case Collective::send_recv: return l.alpha + S * l.beta;  // one block to the next rank
    default: return 0;
  }
}

// One GEMM shape (m x k times k x n; ta, tb: whether A and B are stored transposed, as the layers
// call it) and how many times a step runs it.
struct Gemm {
  std::int64_t m = 0, n = 0, k = 0, count = 0;
  bool ta = false, tb = false;
  bool fp8 = false;  // on float8 casts of its operands (ops::ScaledGemm)
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  // The elements an FP8 GEMM casts: op(A) (m, k) and op(B) (n, k).
  std::int64_t cast_elements() const { return (m + n) * k; }
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
  double fp8_cast = 0;  // elements cast to float8 (each FP8 GEMM's two operands): an amax pass and the cast
};

// What one rank of a data x tensor mesh (pipe 1) runs in a step: measured for any model
// (cost/measure_time.hpp, work_of), or GPT-2's closed form (models/gpt2/estimate.hpp).
struct Work {
  std::vector<Gemm> gemms;
  double attention_flops = 0;        // the causal core, forward and backward (and recomputed forwards)
  Elementwise elementwise;           // elements through GELU, LayerNorm, cross-entropy, AdamW
  std::int64_t allocated_bytes = 0;  // every buffer the step allocates
  std::vector<Comm> comms;
  footprint::StepPeak memory;  // the step's memory plan
};

// The machine's rates.
struct Rates {
  std::function<double(const Gemm&)> gemm_flops;  // FLOP/s at a shape
  double attention_flops = 0;                     // FLOP/s of the attention core
  Elementwise elements;                           // elements/s of each op, forward and backward
  double bandwidth = 0;                           // bytes/s read or written by a streaming op
  double first_touch = 0;                         // bytes/s allocated and written for the first time
  Link tensor, data;                              // the links of the tensor and data groups
  Link expert;  // the expert group's (its token dispatch and combine): data ranks, on the data link by default
};

struct Breakdown {
  double gemm = 0, attention = 0, elementwise = 0, memory = 0, tensor_comm = 0, data_comm = 0;
  double expert_comm = 0;  // the expert group's token dispatch and combine (its gradients are data_comm)
  double total() const { return gemm + attention + elementwise + memory + tensor_comm + data_comm + expert_comm; }
};

inline Breakdown seconds(const Work& w, const Rates& r) {
  Breakdown b;
  for (const Gemm& x : w.gemms)
    if (x.count > 0 && x.flops() > 0) b.gemm += static_cast<double>(x.count) * x.flops() / r.gemm_flops(x);
  b.attention = w.attention_flops / r.attention_flops;
  const Elementwise& n = w.elementwise;
  const Elementwise& e = r.elements;
  b.elementwise = n.gelu / e.gelu + n.layernorm / e.layernorm + n.cross_entropy / e.cross_entropy + n.adamw / e.adamw;
  if (n.fp8_cast > 0) b.elementwise += n.fp8_cast / e.fp8_cast;
  const double bytes = static_cast<double>(w.allocated_bytes);
  b.memory = bytes / r.first_touch + 2 * bytes / r.bandwidth;
  for (const Comm& x : w.comms) {
    const Link& l = x.axis == Axis::tensor ? r.tensor : x.axis == Axis::expert ? r.expert : r.data;
    const double t = static_cast<double>(x.count) * collective_seconds(x.collective, x.degree, x.bytes, l);
    (x.axis == Axis::tensor ? b.tensor_comm : x.axis == Axis::expert ? b.expert_comm : b.data_comm) += t;
  }
  return b;
}

// A pipelined step on a data x pipe x tensor mesh.
struct PipelineTime {
  double step = 0;             // the slowest pipe rank: the schedule, its once-a-step part, the tied all-reduce
  double makespan = 0;         // the schedule's forwards, backwards and messages (the simulation)
  double block = 0;            // one block's forward and backward of one micro-batch
  double ends = 0;             // the embedding's and the head's, of one micro-batch
  double message = 0;          // one activation or gradient between neighbouring ranks
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
PipelineTime pipeline_seconds_of(Cost&& cost, std::int64_t layers, const pipeline::Table& t, double message,
                                 double tied) {
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

}  // namespace weft::estimate
