// train_gpt's memory plan: per pipe rank, the persistent state (weft/plan/memory.hpp, exact) and the
// peak of a step (weft/plan/step.hpp: replayed, with the pipeline schedule's table when --pipe > 1;
// exact on the host, plus an estimate of the CUDA workspace on the GPU). Host code only: the CUDA
// translation unit does not include it.
#pragma once

#include <weft/plan/host_rates.hpp>
#include <weft/plan/memory.hpp>
#include <weft/plan/step.hpp>
#include <weft/plan/time.hpp>

#include "train_gpt.hpp"

namespace train_gpt {

struct RankPlan {
  int pipe_rank = 0;
  footprint::Memory state;  // before the first step
  footprint::Memory peak;   // each category's peak during a step
  std::int64_t total = 0;   // the peak of their sum
  bool exact = false;       // on the host: the allocator's counts; on the GPU, plus an estimated workspace
};

template <class Strategy, bool SP, class P>
std::vector<RankPlan> plan_ranks(const Options& o, const gpt2::Config& c, bool host) {
  const Spread s{.data_degree = o.data, .tensor_degree = o.tensor};
  const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
  // On the GPU: the CUDA back end's workspace on top (an estimate, not replayed).
  const std::int64_t extra = host ? 0 : footprint::cuda_workspace(c, s, micro);
  std::vector<RankPlan> out;
  if (o.pipe == 1) {
    const auto step = footprint::step<Strategy, P, SP>(c, s, micro, o.batch / micro);
    out.push_back({0, step.after, step.peak, step.total + extra, host});
    return out;
  }
  // main checked the partition and the table
  const pipeline::Table table =
      pipeline::make_table(schedule_kind(o.schedule), o.pipe, static_cast<int>(o.batch / micro), o.virtual_stages);
  for (int r = 0; r < o.pipe; ++r) {
    const auto step = footprint::pipeline_step<Strategy, P, SP>(c, s, micro, table, r);
    out.push_back({r, step.after, step.peak, step.total + extra, host});
  }
  return out;
}

// f.template operator()<Strategy, SP, P, T>() for the options' strategy and precision, T the type
// whose host rates price it (f32 for bf16).
template <class F>
decltype(auto) with_plan_types(const Options& o, F&& f) {
  return with_strategy(o, [&]<class S, bool SP>() {
    if (o.dtype == "f64") return f.template operator()<S, SP, F64, double>();
    if (o.dtype == "bf16") return f.template operator()<S, SP, Bf16Mixed, float>();
    return f.template operator()<S, SP, F32, float>();
  });
}

// The plan of the run the options describe, one entry per pipe rank. Call after elements_of has
// ruled out sizes whose element counts overflow.
inline std::vector<RankPlan> plan_of(const Options& o, const gpt2::Config& c, bool host) {
  return with_plan_types(o, [&]<class S, bool SP, class P, class>() { return plan_ranks<S, SP, P>(o, c, host); });
}

// The step time of a run on host thread ranks (pipe 1), from the plan's work and rates measured now
// on this machine with every rank running (weft/plan/host_rates.hpp; f32 rates for bf16).
inline estimate::Breakdown plan_time(const Options& o, const gpt2::Config& c) {
  const Spread s{.data_degree = o.data, .tensor_degree = o.tensor};
  const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
  const MeshShape shape{.data = o.data, .tensor = o.tensor};
  return with_plan_types(o, [&]<class S, bool SP, class P, class T>() {
    const estimate::Work w = estimate::work<S, P, SP>(c, s, micro, o.batch / micro);
    return estimate::seconds(w, estimate::host_rates<T>(w, shape, micro / o.data, c.seq, c.heads, c.width));
  });
}

// The same for a pipeline (--pipe > 1): the schedule's table run with stage costs from the same
// model (estimate::pipeline_seconds), the rates measured with every rank of the mesh running, and
// the thread communicator's data-group link standing in for the pipe's messages.
inline estimate::PipelineTime plan_pipeline_time(const Options& o, const gpt2::Config& c) {
  const Spread s{.data_degree = o.data, .tensor_degree = o.tensor};
  const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
  const int m = static_cast<int>(o.batch / micro);
  const pipeline::Table table = pipeline::make_table(schedule_kind(o.schedule), o.pipe, m, o.virtual_stages);
  const MeshShape busy{.data = o.data * o.pipe, .tensor = o.tensor};
  return with_plan_types(o, [&]<class S, bool SP, class P, class T>() {
    const estimate::Work w = estimate::work<S, P, SP>(c, s, micro, m);
    const estimate::Rates r = estimate::host_rates<T>(w, busy, micro / o.data, c.seq, c.heads, c.width);
    return estimate::pipeline_seconds<S, P, SP>(c, s, micro, table, r, r.data);
  });
}

}  // namespace train_gpt
