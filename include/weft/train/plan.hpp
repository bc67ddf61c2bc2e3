// The trainer's plan of a run for any model family (train::Family): each pipe rank's persistent state
// and the peaks of a training step, measured by running the step on the Meta device
// (cost/measure.hpp: exact, the host allocator's counts), for the check that a run fits and for
// --plan. A family with a plan of its own (Family::plan, Family::print_plan; GPT-2's constexpr
// replay in models/gpt2/run_plan.hpp) uses that one instead.
#pragma once

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "weft/cost/host_rates.hpp"
#include "weft/cost/measure.hpp"
#include "weft/cost/measure_time.hpp"
#include "weft/nn/describe.hpp"
#include "weft/pipeline/schedule.hpp"
#include "weft/train/devices.hpp"
#include "weft/train/family.hpp"
#include "weft/train/flops.hpp"
#include "weft/train/options.hpp"
#include "weft/train/rank_plan.hpp"
#include "weft/train/strategies.hpp"

namespace weft::train {

// The run the options describe, for the plan.
inline footprint::Run planned_run(const Options& o) {
  const std::int64_t micro = o.optim.micro();
  return {.mesh = o.mesh.shape(),
          .micro_batch = micro,
          .micro_batches = o.optim.batch / micro,
          .schedule = pipeline::kind_named(o.mesh.schedule),
          .virtual_stages = o.mesh.virtual_stages};
}

// The most ranks a measured plan runs (one thread each, run_threads' limit).
inline constexpr int kMaxMeasuredRanks = 1024;

// Every rank's step measured on the Meta device, by world rank.
template <Family F>
std::vector<footprint::RankStep> measured_ranks(const Options& o, const config_t<F>& cfg) {
  if (o.mesh.ranks() > kMaxMeasuredRanks)
    throw Error(o.where("--plan"),
                cat("the plan of a family without its own runs a thread per rank, and ", o.mesh.ranks(),
                    " ranks are more than ", kMaxMeasuredRanks),
                cat("plan a mesh of at most ", kMaxMeasuredRanks,
                    " ranks (the same tensor and pipe degrees, fewer data ranks: "
                    "the state per rank falls with sharded strategies, so it is an upper bound for them)"));
  const footprint::Run run = planned_run(o);
  return with_strategy(strategies_t<F>{}, o.mesh.strategy, [&]<class S, bool SP>() {
    return with_precision(host_precisions_t<F>{}, o.model.dtype,
                          [&]<class P>() { return footprint::measure<ModelOn<F, P, SP>::template on, S>(cfg, run); });
  });
}

// One entry per pipe rank: of its data and tensor ranks, the one with the largest step peak.
// `host`: on the host (exact); otherwise on the GPU, where the CUDA back end's workspaces come on
// top, not counted.
inline std::vector<RankPlan> plan_of(const std::vector<footprint::RankStep>& ranks, int pipe, bool host) {
  std::vector<RankPlan> out(static_cast<std::size_t>(pipe));
  for (int r = 0; r < pipe; ++r) out[static_cast<std::size_t>(r)].pipe_rank = r;
  for (const footprint::RankStep& r : ranks) {
    RankPlan& p = out[static_cast<std::size_t>(r.coord.pipe)];
    if (r.step.total < p.total) continue;
    p = {r.coord.pipe, r.state, r.step.peak, r.step.total, host, r.collectives};
  }
  return out;
}

// The measured plan of the run the options describe, one entry per pipe rank.
template <Family F>
std::vector<RankPlan> measured_plan(const Options& o, const config_t<F>& cfg, bool host) {
  return plan_of(measured_ranks<F>(o, cfg), o.mesh.pipe, host);
}

// --plan's table: each pipe rank's peak per category and of their sum (">=" where not exact).
inline void print_rank_table(const std::vector<RankPlan>& plan) {
  const char* bound = plan[0].exact ? "" : ">= ";
  std::printf("%-10s %12s %12s %12s %12s %14s %14s %14s\n", "pipe rank", "parameters", "gradients", "master",
              "optimizer", "activations", "communication", "step peak");
  for (const RankPlan& p : plan) {
    const auto at = [&](Category c) { return mib(static_cast<double>(p.peak.of(c))); };
    std::printf("%-10d %12s %12s %12s %12s %14s %14s %14s\n", p.pipe_rank, at(Category::parameters).c_str(),
                at(Category::gradients).c_str(), at(Category::master_weights).c_str(),
                at(Category::optimizer_state).c_str(), cat(bound, at(Category::activations)).c_str(),
                at(Category::communication).c_str(), cat(bound, mib(static_cast<double>(p.total))).c_str());
  }
}

// Each operation of `c` that was called: "<prefix>all_reduce 3 calls 24 bytes, ..." ("" if none).
inline std::string counted_calls(const threads::Counters& c, const std::string& prefix = {}) {
  std::string out;
  for (std::size_t op = 0; op < threads::kOps; ++op)
    if (c.calls[op] > 0)
      out += cat(out.empty() ? "" : ", ", prefix, threads::name(static_cast<threads::Op>(op)), " ", c.calls[op],
                 " calls ", c.bytes[op], " bytes");
  return out;
}

// describe's table of the run's model, per layer (nn/describe.hpp: its layers walked), the model
// built whole on the Meta device (it allocates nothing).
template <Family F>
std::string described_plan(const Options& o, const config_t<F>& cfg) {
  const std::int64_t micro = o.optim.micro();
  const Spread s{.data_degree = o.mesh.data,
                 .tensor_degree = o.mesh.tensor,
                 .context_degree = o.mesh.context,
                 .expert_degree = o.mesh.expert};
  const auto of = [&]<bool SP>() {
    return with_precision(host_precisions_t<F>{}, o.model.dtype, [&]<class P>() {
      using M = typename ModelOn<F, P, SP>::template on<Meta<Host>>;
      if constexpr (nn::MetaDescribable<M>) {
        return nn::describe<M>(cfg, micro, s);
      } else {
        return std::string("describe: the model's stages give no plan rows (nn/comm_walk.hpp)\n");
      }
    });
  };
  return o.mesh.sequence_parallel() ? of.template operator()<true>() : of.template operator()<false>();
}

// --plan's line of collectives per pipe rank: this rank's, per axis of degree > 1 (a group of one
// moves nothing; the data axis holds the data x context group's reductions).
inline void print_rank_collectives(const Options& o, const std::vector<RankPlan>& plan) {
  for (const RankPlan& p : plan) {
    std::string line;
    for (Axis a : kAxes) {
      const int group = a == Axis::data      ? o.mesh.data * o.mesh.context
                        : a == Axis::pipe    ? o.mesh.pipe
                        : a == Axis::context ? o.mesh.context
                        : a == Axis::expert  ? o.mesh.expert
                                             : o.mesh.tensor;
      if (group == 1) continue;
      const std::string axis = counted_calls(p.collectives[static_cast<std::size_t>(a)], cat(name(a), " "));
      if (!axis.empty()) line += cat(line.empty() ? "" : ", ", axis);
    }
    std::printf("collectives of a step on pipe rank %d (this rank's, per axis of degree > 1): %s\n", p.pipe_rank,
                line.empty() ? "none" : line.c_str());
  }
}

// Each stage's collectives of one micro-batch on the tensor axis (describe's table, measured);
// when every block asks the same, the first block is printed for them all.
inline void print_stage_collectives(const std::vector<footprint::StageCollectives>& stages) {
  const auto t = static_cast<std::size_t>(Axis::tensor);
  const auto line = [&](const threads::Counters& c) {
    const std::string out = counted_calls(c);
    return out.empty() ? std::string("none") : out;
  };
  const auto same = [&](const footprint::StageCollectives& a, const footprint::StageCollectives& b) {
    return a.forward[t].calls == b.forward[t].calls && a.forward[t].bytes == b.forward[t].bytes &&
           a.backward[t].calls == b.backward[t].calls && a.backward[t].bytes == b.backward[t].bytes;
  };
  bool uniform = stages.size() > 2;
  for (std::size_t st = 2; st + 1 < stages.size(); ++st) uniform = uniform && same(stages[st], stages[1]);
  std::printf("collectives of one micro-batch on the tensor axis, by stage (measured):\n");
  for (std::size_t st = 0; st < stages.size(); ++st) {
    if (uniform && st > 1 && st + 1 < stages.size()) continue;
    const std::string name = uniform && st == 1 ? cat(stages[st].stage, " (and every block)") : stages[st].stage;
    std::printf("  %-24s forward: %s; backward: %s\n", name.c_str(), line(stages[st].forward[t]).c_str(),
                line(stages[st].backward[t]).c_str());
  }
}

template <Family F>
std::vector<footprint::StageCollectives> measured_stage_collectives(const Options& o, const config_t<F>& cfg) {
  return with_strategy(strategies_t<F>{}, o.mesh.strategy, [&]<class S, bool SP>() {
    return with_precision(host_precisions_t<F>{}, o.model.dtype, [&]<class P>() {
      return footprint::stage_collectives<ModelOn<F, P, SP>::template on>(
          cfg, {.data = o.mesh.data, .context = o.mesh.context, .tensor = o.mesh.tensor, .expert = o.mesh.expert},
          o.optim.micro());
    });
  });
}

// The step time (pipe 1, on the host): the measured step's work (estimate::work_of) at the rates of
// this host, measured now with every rank running; the attention core's rate needs the heads.
template <Family F>
void print_step_time(const Options& o, const config_t<F>& cfg, const footprint::RankStep& rank, bool host) {
  if constexpr (requires { cfg.heads; }) {
    if (o.mesh.pipe == 1 && o.mesh.context == 1 && host) {
      const estimate::Work w = estimate::work_of(rank, planned_run(o).mesh);
      const MeshShape shape{.data = o.mesh.data, .tensor = o.mesh.tensor};
      const auto time = [&]<class T>() {
        return estimate::seconds(
            w, estimate::host_rates<T>(w, shape, o.optim.micro() / o.mesh.data, cfg.seq, cfg.heads, cfg.width));
      };
      const estimate::Breakdown t =
          o.model.dtype == "f64" ? time.template operator()<double>() : time.template operator()<float>();
      std::printf(
          "step time: %.2f ms = GEMMs %.2f + attention %.2f + elementwise %.2f + memory %.2f + tensor collectives "
          "%.2f + data collectives %.2f (the measured step's work at rates measured now on this host with %d ranks "
          "running; no overlap; the family's own ops not priced)\n",
          1e3 * t.total(), 1e3 * t.gemm, 1e3 * t.attention, 1e3 * t.elementwise, 1e3 * t.memory, 1e3 * t.tensor_comm,
          1e3 * t.data_comm, o.mesh.data * o.mesh.tensor);
      return;
    }
  }
  std::printf("step time: planned on the host with --pipe 1 and without --context only\n");
}

// --plan for a family without a plan of its own: the measured table per pipe rank, the collectives,
// the model's rows, the FLOPs and the step time.
template <Family F>
int print_measured_plan(const Options& o, const config_t<F>& cfg, const std::string& device) {
  std::printf("plan: %s: %s | %s, %s | %s%s | batch %lld, micro-batch %lld\n", F::name().c_str(),
              summary<F>(cfg).c_str(), o.mesh.strategy.c_str(), o.model.dtype.c_str(), o.mesh.text().c_str(),
              o.mesh.context > 1 ? cat(" (", o.mesh.attention, " attention)").c_str() : "",
              static_cast<long long>(o.optim.batch), static_cast<long long>(o.optim.micro()));
  const bool host = device != "cuda";
  const std::vector<footprint::RankStep> ranks = measured_ranks<F>(o, cfg);
  const std::vector<RankPlan> plan = plan_of(ranks, o.mesh.pipe, host);
  print_rank_table(plan);
  std::printf(
      "(per rank: each category's peak during a training step, and the peak of their sum, measured by running the "
      "step%s on the Meta device: %s; persistent state %s; step peak %lld bytes%s",
      o.mesh.pipe > 1 ? cat(" and the ", o.mesh.schedule, " schedule").c_str() : "",
      host ? "the host allocator's counts" : "the host allocator's counts, without the CUDA back end's workspaces",
      mib(static_cast<double>(plan[0].state.total())).c_str(), static_cast<long long>(plan[0].total),
      o.mesh.pipe > 1 ? " on pipe rank 0" : "");
  for (std::size_t r = 1; r < plan.size(); ++r)
    std::printf("; pipe rank %d: %lld bytes", plan[r].pipe_rank, static_cast<long long>(plan[r].total));
  std::printf(")\n");
  print_rank_collectives(o, plan);
  if (o.mesh.tensor > 1 && o.mesh.pipe == 1) print_stage_collectives(measured_stage_collectives<F>(o, cfg));
  if (o.mesh.pipe == 1) std::printf("%s", described_plan<F>(o, cfg).c_str());
  const double flops = family_flops_per_token<F>(cfg) * static_cast<double>(o.optim.batch * cfg.seq);
  std::printf("FLOPs per step: %.4g (%lld tokens)\n", flops, static_cast<long long>(o.optim.batch * cfg.seq));
  print_step_time<F>(o, cfg, ranks[0], host);
  return 0;
}

}  // namespace weft::train
