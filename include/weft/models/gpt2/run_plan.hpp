// GPT-2's plan of a trainer's run (train::Options): per pipe rank, the persistent state
// (cost/memory.hpp, exact) and the peak of a step (models/gpt2/replay.hpp: replayed, with the pipeline
// schedule's table when --pipe > 1; exact on the host, plus an estimate of the CUDA workspace on
// the GPU), the step time on this host (cost/time.hpp), and --plan's table. Host code: the GPU's
// translation unit does not include it. The definitions of gpt2::Family::plan and print_plan.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "weft/cost/host_rates.hpp"
#include "weft/cost/memory.hpp"
#include "weft/cost/time.hpp"
#include "weft/models/gpt2/estimate.hpp"
#include "weft/models/gpt2/family.hpp"
#include "weft/nn/describe.hpp"
#include "weft/pipeline/schedule.hpp"
#include "weft/train/devices.hpp"
#include "weft/train/plan.hpp"
#include "weft/train/strategies.hpp"

namespace weft::gpt2 {

// approximate_elements (footprint.hpp) of the run (one micro-batch): sizes beyond footprint::kMaxElements
// are refused before the plan, whose 64-bit counts they would overflow.
inline double elements_of(const train::Options& o, const Config& c) {
  return gpt2::approximate_elements(c, static_cast<double>(o.optim.micro()), o.mesh.tensor);
}

template <class Strategy, bool SP, class P>
std::vector<RankPlan> plan_ranks(const train::Options& o, const Config& c, bool host) {
  const Spread s{.data_degree = o.mesh.data, .tensor_degree = o.mesh.tensor};
  const std::int64_t micro = o.optim.micro_batch > 0 ? o.optim.micro_batch : o.optim.batch;
  // On the GPU: the CUDA back end's workspace on top (an estimate, not replayed).
  const std::int64_t extra = host ? 0 : footprint::cuda_workspace(c, s, micro);
  std::vector<RankPlan> out;
  if (o.mesh.pipe == 1) {
    const auto step = footprint::step<Strategy, P, SP>(c, s, micro, o.optim.batch / micro);
    out.push_back({0, step.after, step.peak, step.total + extra, host});
    return out;
  }
  // main checked the partition and the table
  const pipeline::Table table = pipeline::make_table(pipeline::kind_named(o.mesh.schedule), o.mesh.pipe,
                                                     static_cast<int>(o.optim.batch / micro), o.mesh.virtual_stages);
  for (int r = 0; r < o.mesh.pipe; ++r) {
    const auto step = footprint::pipeline_step<Strategy, P, SP>(c, s, micro, table, r);
    out.push_back({r, step.after, step.peak, step.total + extra, host});
  }
  return out;
}

// f.template operator()<Strategy, SP, P, T>() for the options' strategy and precision, T the type
// whose host rates price it (f32 for bf16).
template <class F>
decltype(auto) with_plan_types(const train::Options& o, F&& f) {
  return train::with_strategy(train::strategies_t<Family>{}, o.mesh.strategy, [&]<class S, bool SP>() {
    return train::with_precision(train::host_precisions_t<Family>{}, o.model.dtype, [&]<class P>() {
      return f.template operator()<S, SP, P, std::conditional_t<std::same_as<P, F64>, double, float>>();
    });
  });
}

// The plan of the run the options describe, one entry per pipe rank. Call after elements_of has
// ruled out sizes whose element counts overflow.
inline std::vector<RankPlan> plan_of(const train::Options& o, const Config& c, bool host) {
  return with_plan_types(o, [&]<class S, bool SP, class P, class>() { return plan_ranks<S, SP, P>(o, c, host); });
}

// The step time of a run on host thread ranks (pipe 1), from the plan's work and rates measured now
// on this machine with every rank running (weft/cost/host_rates.hpp; f32 rates for bf16).
inline estimate::Breakdown plan_time(const train::Options& o, const Config& c) {
  const Spread s{.data_degree = o.mesh.data, .tensor_degree = o.mesh.tensor};
  const std::int64_t micro = o.optim.micro_batch > 0 ? o.optim.micro_batch : o.optim.batch;
  const MeshShape shape{.data = o.mesh.data, .tensor = o.mesh.tensor};
  return with_plan_types(o, [&]<class S, bool SP, class P, class T>() {
    const estimate::Work w = estimate::work<S, P, SP>(c, s, micro, o.optim.batch / micro);
    return estimate::seconds(w, estimate::host_rates<T>(w, shape, micro / o.mesh.data, c.seq, c.heads, c.width));
  });
}

// The same for a pipeline (--pipe > 1): the schedule's table run with stage costs from the same
// model (estimate::pipeline_seconds), the rates measured with every rank of the mesh running, and
// the thread communicator's data-group link standing in for the pipe's messages.
inline estimate::PipelineTime plan_pipeline_time(const train::Options& o, const Config& c) {
  const Spread s{.data_degree = o.mesh.data, .tensor_degree = o.mesh.tensor};
  const std::int64_t micro = o.optim.micro_batch > 0 ? o.optim.micro_batch : o.optim.batch;
  const int m = static_cast<int>(o.optim.batch / micro);
  const pipeline::Table table =
      pipeline::make_table(pipeline::kind_named(o.mesh.schedule), o.mesh.pipe, m, o.mesh.virtual_stages);
  const MeshShape busy{.data = o.mesh.data * o.mesh.pipe, .tensor = o.mesh.tensor};
  return with_plan_types(o, [&]<class S, bool SP, class P, class T>() {
    const estimate::Work w = estimate::work<S, P, SP>(c, s, micro, m);
    const estimate::Rates r = estimate::host_rates<T>(w, busy, micro / o.mesh.data, c.seq, c.heads, c.width);
    return estimate::pipeline_seconds<S, P, SP>(c, s, micro, table, r, r.data);
  });
}

inline std::vector<RankPlan> Family::plan(const train::Options& o, const Config& c, bool host) {
  if (const double n = elements_of(o, c); n > footprint::kMaxElements)
    throw Error(o.where(),
                cat("layers ", c.layers, ", width ", c.width, ", seq ", c.seq, ", vocab ", c.vocab, ", batch ",
                    o.optim.batch, ": about ", n, " elements (parameters, activations), more than any machine"),
                cat("use a smaller model, batch or micro-batch, more tensor or pipeline ranks, or a sharded strategy "
                    "(zero1, zero2, fsdp); ",
                    o.program, " --plan prints the plan"));
  return plan_of(o, c, host);
}

// --plan: what each rank holds and a step computes, from the types and sizes alone.
inline int Family::print_plan(const train::Options& o, const Config& cfg, const std::string& device) {
  std::printf(
      "plan: layers %lld, heads %lld, width %lld, seq %lld, vocab %lld | %s, %s | data %d x pipe %d x tensor %d | "
      "batch %lld, micro-batch %lld\n",
      static_cast<long long>(cfg.layers), static_cast<long long>(cfg.heads), static_cast<long long>(cfg.width),
      static_cast<long long>(cfg.seq), static_cast<long long>(cfg.vocab), o.mesh.strategy.c_str(),
      o.model.dtype.c_str(), o.mesh.data, o.mesh.pipe, o.mesh.tensor, static_cast<long long>(o.optim.batch),
      static_cast<long long>(o.optim.micro_batch > 0 ? o.optim.micro_batch : o.optim.batch));
  if (const double n = elements_of(o, cfg); n > footprint::kMaxElements)  // an error (exit 2), never a plan of exit 0
    throw Error(o.where("--plan"),
                cat("layers ", cfg.layers, ", width ", cfg.width, ", seq ", cfg.seq, ", vocab ", cfg.vocab, ", batch ",
                    o.optim.batch, ": about ", n,
                    " elements (parameters, activations): too large to plan, and to fit any machine"),
                "use a smaller model, batch or micro-batch");
  const std::vector<RankPlan> plan = plan_of(o, cfg, device != "cuda");
  train::print_rank_table(plan);
  if (plan[0].exact) {
    std::printf(
        "(per rank: each category's peak during a training step, and the peak of their sum, replayed from the "
        "types and sizes%s: the host allocator's counts; persistent state %s; step peak %lld bytes%s",
        o.mesh.pipe > 1 ? cat(" and the ", o.mesh.schedule, " schedule's table").c_str() : "",
        train::mib(static_cast<double>(plan[0].state.total())).c_str(), static_cast<long long>(plan[0].total),
        o.mesh.pipe > 1 ? " on pipe rank 0" : "");
    for (std::size_t r = 1; r < plan.size(); ++r)
      std::printf("; pipe rank %d: %lld bytes", plan[r].pipe_rank, static_cast<long long>(plan[r].total));
    std::printf(")\n");
  } else
    std::printf(
        "(per rank: the step replayed as the host allocator counts it, plus an estimate of the CUDA workspace "
        "(cuBLASLt's, the attention scores) in the step peak; step peak %lld bytes)\n",
        static_cast<long long>(plan[0].total));
  const double flops = gpt2::flops_per_token(cfg) * static_cast<double>(o.optim.batch * cfg.seq);
  std::printf("FLOPs per step: %.4g (6 N + 12 L C T per token, %lld tokens)\n", flops,
              static_cast<long long>(o.optim.batch * cfg.seq));
  if (o.mesh.pipe == 1) {
    const std::int64_t micro = o.optim.micro_batch > 0 ? o.optim.micro_batch : o.optim.batch;
    const Spread s{.data_degree = o.mesh.data, .tensor_degree = o.mesh.tensor};
    const bool sp = o.mesh.strategy.ends_with("-sp");
    // in the run's precision: FP8's amax all-reduces are its own (nn::Linear::comm_rows)
    const std::string table = train::with_precision(train::host_precisions_t<Family>{}, o.model.dtype, [&]<class P>() {
      using Meta = weft::Meta<Host>;
      return sp ? nn::describe<Model<P, true, recompute::None, Meta>>(cfg, micro, s)
                : nn::describe<Model<P, false, recompute::None, Meta>>(cfg, micro, s);
    });
    std::printf("collectives of one micro-batch (tensor axis; the data axis adds the strategy's):\n%s", table.c_str());
  }
  if (o.mesh.pipe == 1 && device != "cuda") {
    const estimate::Breakdown t = plan_time(o, cfg);
    std::printf(
        "step time: %.2f ms = GEMMs %.2f + attention %.2f + elementwise %.2f + memory %.2f + tensor collectives %.2f "
        "+ data collectives %.2f (rates measured now on this host with %d ranks running; no overlap)\n",
        1e3 * t.total(), 1e3 * t.gemm, 1e3 * t.attention, 1e3 * t.elementwise, 1e3 * t.memory, 1e3 * t.tensor_comm,
        1e3 * t.data_comm, o.mesh.data * o.mesh.tensor);
  } else if (device != "cuda") {
    const estimate::PipelineTime t = plan_pipeline_time(o, cfg);
    std::string bubbles;
    for (std::size_t r = 0; r < t.bubble.size(); ++r)
      bubbles += cat(r ? ", " : "", std::round(1000 * t.bubble[r]) / 10, "%");
    std::printf(
        "step time: %.2f ms = the %s schedule's forwards, backwards and messages %.2f (idle share per pipe rank: "
        "%s) + after it %.2f (the optimizer step, the data collectives, the tied table's sum); a block's forward and "
        "backward %.3f ms per micro-batch, the embedding and head %.3f; rates measured now on this host with %d ranks "
        "running; no overlap\n",
        1e3 * t.step, o.mesh.schedule.c_str(), 1e3 * t.makespan, bubbles.c_str(), 1e3 * (t.step - t.makespan),
        1e3 * t.block, 1e3 * t.ends, o.mesh.data * o.mesh.pipe * o.mesh.tensor);
  } else {
    std::printf(
        "step time: not planned here (the GPU's rates are not measured by --plan); weft-plan estimates GPU "
        "clusters\n");
  }
  return 0;
}

}  // namespace weft::gpt2
