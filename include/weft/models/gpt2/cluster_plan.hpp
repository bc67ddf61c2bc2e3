// GPT-2's cost of a layout on a cluster for weft-plan (plan/cluster.hpp): the peak of a step per GPU
// from the constexpr replay (models/gpt2/replay.hpp, with the pipeline schedule's table for the largest pipe
// rank), plus the CUDA back end's workspace estimate (and, in FP8, the largest GEMM's float8
// casts), and the step time from the closed forms
// (cost/time.hpp) at the cluster's rates. Closed forms, so a layout of any size costs microseconds;
// tests/cost/measure.cpp holds them to the step measured on the Meta device. The definition of
// gpt2::Family::cluster_cost; only weft-plan's translation unit includes it.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "weft/cost/time.hpp"
#include "weft/models/gpt2/estimate.hpp"
#include "weft/models/gpt2/family.hpp"
#include "weft/plan/cluster.hpp"
#include "weft/recompute/policies.hpp"
#include "weft/train/strategies.hpp"

namespace weft::gpt2 {

namespace detail {
template <class Strategy, class P, bool SP, class R>
train::Candidate cluster_cost(const Config& c, const train::Setup& x, const train::Cluster& k) {
  using T = typename precision_t<P>::compute;
  const Spread s{.data_degree = x.data, .tensor_degree = x.tensor};
  gpt2::validate(c, s, SP, x.micro);  // sizes this degree does not divide
  const estimate::Work w = estimate::work<Strategy, P, SP, R>(c, s, x.micro, x.accumulation);
  train::Candidate out;
  out.workspace_bytes = footprint::cuda_workspace(c, s, x.micro);
  // FP8: the largest GEMM's two float8 casts (a byte an element) beside it
  std::int64_t casts = 0;
  for (const estimate::Gemm& g : w.gemms)
    if (g.fp8) casts = std::max(casts, g.cast_elements());
  out.workspace_bytes += casts;
  const estimate::Rates rates = train::cluster_rates<T>(k, x.tensor, x.data, x.pipe);
  out.time = estimate::seconds(w, rates);
  if (x.pipe == 1) {
    out.peak_bytes = w.memory.total + out.workspace_bytes;
    out.state_bytes = w.memory.after.total();
    return out;
  }
  const pipeline::Table table =
      pipeline::make_table(x.schedule, x.pipe, static_cast<int>(x.accumulation), x.virtual_stages);
  for (int r = 0; r < x.pipe; ++r) {  // the largest pipe rank
    const auto st = footprint::pipeline_step<Strategy, P, SP, R>(c, s, x.micro, table, r);
    out.peak_bytes = std::max(out.peak_bytes, st.total + out.workspace_bytes);
    out.state_bytes = std::max(out.state_bytes, st.after.total());
  }
  const estimate::PipelineTime pt =
      estimate::pipeline_seconds<Strategy, P, SP, R>(c, s, x.micro, table, rates, k.pipe_link(x.tensor, x.pipe));
  train::share_over_pipe(out, out.time, pt, x.pipe);
  return out;
}
}  // namespace detail

inline train::Candidate Family::cluster_cost(const Config& c, const train::Setup& x, const train::Cluster& k,
                                             const std::string& dtype) {
  return train::with_strategy(train::strategies_t<Family>{}, x.strategy, [&]<class S, bool SP>() {
    return train::with_precision(cluster_precisions{}, dtype, [&]<class P>() {
      return x.recompute ? detail::cluster_cost<S, P, SP, recompute::Full>(c, x, k)
                         : detail::cluster_cost<S, P, SP, recompute::None>(c, x, k);
    });
  });
}

inline std::string Family::cluster_peak_note(const Config& c) {
  return cat("the step's peak per GPU, with an estimate of the CUDA workspace: cuBLASLt's ",
             std::round(static_cast<double>(footprint::cuda_workspace(c, {.data_degree = 1, .tensor_degree = 1}, 0)) /
                        (1 << 20)),
             " MiB and the attention scores");
}

}  // namespace weft::gpt2
