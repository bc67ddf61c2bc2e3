// The search of weft-plan for any model family: the cluster (train::Cluster: GPUs, memory, peak
// FLOP/s, bandwidths and links), the setups worth planning on it (train::search: every tensor
// degree up to a node, every compiled strategy with and without SP, with and without full
// recompute where the family has it, pipelines under 1F1B, ZB-H1 and interleaved 1F1B, and for a
// mixture of experts every expert degree carved from the data ranks), and what one setup costs
// (train::Candidate: the step's peak per GPU and its time). How a setup is costed is the family's
// (GPT-2's closed forms, models/gpt2/cluster_plan.hpp) or the step measured on the Meta device
// (plan/search.hpp).
//
// This header is plain C++20.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/cost/time.hpp"
#include "weft/pipeline/schedule.hpp"

namespace weft::train {

struct Cluster {
  int gpus = 8, gpus_per_node = 8;
  double memory_gib = 141;                // device memory (H200)
  double peak_tflops = 989;               // dense bf16 (H200 SXM)
  double fp8_tflops = 1979;               // dense FP8 (H200 SXM): an FP8 GEMM's peak (--dtype fp8-*)
  double hbm_gbps = 4800;                 // device memory bandwidth, GB/s
  double intra_gbps = 450, intra_us = 3;  // NVLink per GPU, one direction; latency per message
  double inter_gbps = 50, inter_us = 10;  // InfiniBand NDR 400 Gb/s per GPU; latency per message
  double gemm_efficiency = 0.7;           // of the peak, for the step's GEMMs
  double attention_efficiency = 0.3;      // of the peak, for the attention core (materialized scores)

  estimate::Link intra() const { return {intra_us * 1e-6, 1 / (intra_gbps * 1e9)}; }
  estimate::Link inter() const { return {inter_us * 1e-6, 1 / (inter_gbps * 1e9)}; }
  // The link between pipe neighbours: inside a node while a pipe group fits in one (ranks
  // tensor-innermost, then pipe).
  estimate::Link pipe_link(int tensor, int pipe) const { return tensor * pipe > gpus_per_node ? inter() : intra(); }
};

// The time model's rates on the cluster for elements of type T: GEMMs and the attention core at a
// fraction of the peak (an FP8 GEMM's of the FP8 peak), elementwise ops at the HBM bandwidth (a
// float8 cast reads its operand twice, for the amax and for the cast, and writes a byte), tensor collectives on the
// intra-node link, data collectives on the inter-node link once the data group leaves the node, and the expert group's
// (`expert` neighbouring data ranks) once it leaves the node.
template <class T>
estimate::Rates cluster_rates(const Cluster& k, int tensor, int data, int pipe = 1, int expert = 1) {
  const double peak = k.peak_tflops * 1e12, hbm = k.hbm_gbps * 1e9, e = sizeof(T);
  estimate::Rates r;
  r.gemm_flops = [f = peak * k.gemm_efficiency, f8 = k.fp8_tflops * 1e12 * k.gemm_efficiency](const estimate::Gemm& g) {
    return g.fp8 ? f8 : f;
  };
  r.attention_flops = peak * k.attention_efficiency;
  // Bytes each op moves per element, forward and backward: GELU and LayerNorm read and write their
  // input, output and saved copy (7 e), the cross-entropy reads the logits three times and writes
  // their gradient (4 e), AdamW reads and writes f32 state (30 bytes with the master's rounding).
  r.elements = {.gelu = hbm / (7 * e),
                .layernorm = hbm / (7 * e),
                .cross_entropy = hbm / (4 * e),
                .adamw = hbm / 30,
                .fp8_cast = hbm / (2 * e + 1)};
  r.bandwidth = hbm;
  r.first_touch = hbm;   // a caching allocator: fresh blocks cost a write, like any other
  r.tensor = k.intra();  // tensor groups stay inside a node (the ranks are laid out tensor-innermost)
  r.data = tensor * pipe * data > k.gpus_per_node ? k.inter() : k.intra();
  r.expert = tensor * pipe * expert > k.gpus_per_node ? k.inter() : k.intra();
  return r;
}

// One setup of the run on the cluster (its strategy, degrees, schedule and micro-batch).
struct Setup {
  std::string strategy;    // "ddp", "zero1-sp", ...: a name of train/strategies.hpp
  bool recompute = false;  // full recompute of every block
  int tensor = 1, data = 1, pipe = 1;
  int expert = 1;  // the expert degree, carved from data: divides data and the model's experts
  pipeline::Kind schedule = pipeline::Kind::one_f_one_b;  // with pipe > 1
  int virtual_stages = 1;
  std::int64_t micro = 0, accumulation = 0;  // the global micro-batch (sequences), micro-batches per step

  std::string name() const { return recompute ? strategy + " +recompute" : strategy; }
  std::string describe() const {
    return cat("tensor ", tensor, strategy.ends_with("-sp") ? " with SP" : "", pipe > 1 ? cat(", pipe ", pipe) : "",
               ", data ", data, expert > 1 ? cat(" (expert ", expert, ")") : "");
  }
  std::string schedule_name() const {
    if (pipe == 1) return "-";
    return schedule == pipeline::Kind::zero_bubble_h1 ? "zb"
           : schedule == pipeline::Kind::interleaved  ? cat("int", virtual_stages)
                                                      : "1f1b";
  }
};

// What a setup costs: its largest rank's step peak and state, and the step's time.
struct Candidate {
  Setup setup;
  double pipeline_s = 0;  // a pipeline's step beyond its parts (idle time, messages, imbalance)
  std::int64_t peak_bytes = 0, state_bytes = 0, workspace_bytes = 0;
  estimate::Breakdown time;  // with pipe > 1: the pipe-1 parts over the pipe degree
  bool fits = false;

  double step_seconds() const { return time.total() + pipeline_s; }
};

// The candidates, ranked, and why the setups left out were (one line per reason).
struct Candidates {
  std::vector<Candidate> list;
  std::vector<std::string> skipped;

  void skip(std::string why) {
    if (std::find(skipped.begin(), skipped.end(), why) == skipped.end()) skipped.push_back(std::move(why));
  }
};

// What the search is over: the strategies compiled, whether full recompute can be planned, the
// model's layers (pipelines split them evenly) and its experts (a mixture of experts: every expert
// degree that divides them and the data degree; 0 for a dense model).
struct Space {
  std::vector<std::string> strategies;  // "ddp", "ddp-sp", ...
  bool recompute = false;
  std::int64_t layers = 1;
  std::int64_t experts = 0;
};

// Every layout of the compiled strategies on the cluster, in the search's order, handed to `each`
// (its data degree, micro-batch and accumulation still to fill); tensor and pipe degrees that do
// not divide the GPUs, the layers or the batch are skipped with their reason.
inline void for_each_layout(const Space& space, const Cluster& k, std::int64_t batch, std::int64_t micro_per_gpu,
                            Candidates& out, const std::function<void(Setup)>& each) {
  const auto has = [&](const std::string& s) {
    return std::find(space.strategies.begin(), space.strategies.end(), s) != space.strategies.end();
  };
  static const char* const flat[] = {"ddp", "ddp-sp", "zero1", "zero1-sp", "zero2", "zero2-sp", "fsdp", "fsdp-sp"};
  static const char* const piped[] = {"ddp", "zero1", "zero1-sp", "fsdp"};
  for (int tp = 1; tp <= k.gpus_per_node && tp <= k.gpus; tp *= 2) {
    if (k.gpus % tp != 0) {
      out.skip(cat("tensor ", tp, ": does not divide ", k.gpus, " GPUs"));
      continue;
    }
    for (bool r : {false, true})
      if (!r || space.recompute)
        for (const char* s : flat)
          if (has(s)) each({.strategy = s, .recompute = r, .tensor = tp});
    // Pipelines: every pipe degree (a power of two) that divides the layers and the GPUs left by
    // the tensor degree, and whose micro-batch count is at least the pipe degree.
    for (int pp = 2; pp <= space.layers && tp * pp <= k.gpus; pp *= 2) {
      if (space.layers % pp != 0 || k.gpus % (tp * pp) != 0) continue;
      const std::int64_t per_micro = micro_per_gpu * (k.gpus / tp / pp);
      if (batch % per_micro != 0 || batch / per_micro < pp) {
        out.skip(cat("tensor ", tp, ", pipe ", pp, ": fewer micro-batches than pipe ranks, or a batch of ", batch,
                     " that is not a multiple of ", per_micro));
        continue;
      }
      const auto piped_as = [&](bool r, pipeline::Kind kind, int v) {
        if (r && !space.recompute) return;
        for (const char* s : piped)
          if (has(s))
            each({.strategy = s, .recompute = r, .tensor = tp, .pipe = pp, .schedule = kind, .virtual_stages = v});
      };
      piped_as(false, pipeline::Kind::one_f_one_b, 1);
      piped_as(false, pipeline::Kind::zero_bubble_h1, 1);
      piped_as(true, pipeline::Kind::one_f_one_b, 1);
      // Interleaved: two virtual stages per rank, where the layers split into 2 pp stages and the
      // micro-batches come in whole groups of pp.
      if (space.layers % (2 * pp) == 0 && batch / per_micro % pp == 0) piped_as(false, pipeline::Kind::interleaved, 2);
    }
  }
}

// Those that fit first, then by step time; equals in the order they were found (a sort over
// positions: std::stable_sort's buffer is deprecated in libstdc++ 12, which clang reports).
inline std::vector<Candidate> ranked(std::vector<Candidate> list) {
  std::vector<std::size_t> order(list.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t i, std::size_t j) {
    const Candidate &a = list[i], &b = list[j];
    if (a.fits != b.fits) return a.fits;
    const double ta = a.step_seconds(), tb = b.step_seconds();
    return ta < tb || (!(tb < ta) && i < j);
  });
  std::vector<Candidate> sorted;
  sorted.reserve(order.size());
  for (std::size_t i : order) sorted.push_back(std::move(list[i]));
  return sorted;
}

// Every layout of `batch` sequences, `micro_per_gpu` per GPU per micro-batch, on the cluster, each
// with every expert degree (a power of two) that divides the model's experts and the data degree,
// costed by `cost` (which throws Error for sizes the model refuses: the layout is left out with its
// message), ranked by step time among those that fit.
inline Candidates search(const Space& space, const Cluster& k, std::int64_t batch, std::int64_t micro_per_gpu,
                         const std::function<Candidate(const Setup&)>& cost) {
  Candidates out;
  for_each_layout(space, k, batch, micro_per_gpu, out, [&](Setup x) {
    x.data = k.gpus / x.tensor / x.pipe;
    x.micro = micro_per_gpu * x.data;
    if (batch % x.micro != 0)
      return out.skip(cat(x.describe(), ": the batch of ", batch, " is not a multiple of the micro-batch ", x.micro,
                          " (", micro_per_gpu, " per GPU)"));
    x.accumulation = batch / x.micro;
    for (int ep = 1; ep == 1 || (ep <= x.data && ep <= space.experts); ep *= 2) {
      if (x.data % ep != 0 || (space.experts > 0 && space.experts % ep != 0)) continue;
      x.expert = ep;
      try {
        Candidate c = cost(x);
        c.setup = x;
        c.fits = static_cast<double>(c.peak_bytes) <= k.memory_gib * (1 << 30);
        out.list.push_back(c);
      } catch (const Error& e) {
        out.skip(cat(x.describe(), ": ", e.what()));  // sizes this layout does not divide
        if (ep == 1) break;  // refused without experts: refused with them too (one line for all)
      }
    }
  });
  out.list = ranked(std::move(out.list));
  return out;
}

// A pipelined candidate's time from its pipe-1 time (the whole model on the same data x tensor
// mesh) and the pipeline's: the pipe-1 parts shared over the pipe ranks, the rest the pipeline's.
inline void share_over_pipe(Candidate& x, const estimate::Breakdown& pipe1, const estimate::PipelineTime& pt,
                            int pipe) {
  x.time = pipe1;
  for (double* part : {&x.time.gemm, &x.time.attention, &x.time.elementwise, &x.time.memory, &x.time.tensor_comm,
                       &x.time.data_comm, &x.time.expert_comm})
    *part /= pipe;
  x.pipeline_s = pt.step - x.time.total();
}

}  // namespace weft::train
