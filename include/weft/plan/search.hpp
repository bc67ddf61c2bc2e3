// weft-plan for any model family (train::Family): the plan of a model on a cluster of any number of
// GPUs, for every layout of plan/cluster.hpp, ranked by step time among those that fit. A family
// costs a setup by its own closed forms (Family::cluster_cost: GPT-2's, models/gpt2/cluster_plan.hpp)
// or, by default, by the step measured on the Meta device: the bounding ranks of the mesh, each run
// alone (cost/measure.hpp measure_bounding: exact, the host allocator's counts, on meshes of any
// size), their work priced at the cluster's rates (cost/measure_time.hpp), and a pipeline's time
// from four pipe-1 steps (estimate::pipeline_seconds_of). A user's planner is one line:
//
//   int main(int argc, char** argv) { return weft::train::plan_main<MyFamily>(argc, argv, "my_plan"); }
//
// What the measured cost leaves out, where the family has no closed forms: the CUDA back end's
// workspaces (the peak is the host allocator's) and the family's own ops in the step time (the
// Meta device prices weft's).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "weft/core/files.hpp"
#include "weft/core/json_limits.hpp"
#include "weft/cost/measure.hpp"
#include "weft/cost/measure_time.hpp"
#include "weft/cost/memory.hpp"
#include "weft/plan/cluster.hpp"
#include "weft/recompute/policies.hpp"
#include "weft/train/command_line.hpp"
#include "weft/train/dispatch.hpp"
#include "weft/train/family.hpp"
#include "weft/train/flops.hpp"
#include "weft/train/rank_plan.hpp"
#include "weft/train/strategies.hpp"

namespace weft::train {

namespace detail {
template <class F> struct cluster_precisions_of {
  using type = host_precisions_t<F>;
};
template <class F>
  requires requires { typename F::cluster_precisions; }
struct cluster_precisions_of<F> {
  using type = typename F::cluster_precisions;
};
template <Family F, class P, bool SP, class R>
struct MetaRecomputed {
  template <class D>
  using on = typename F::template recomputed<P, SP, R, D>;
};
}  // namespace detail

// The precisions weft-plan offers for a family: Family::cluster_precisions, or those it compiles.
template <Family F> using cluster_precisions_t = typename detail::cluster_precisions_of<F>::type;

// Whether the family plans full recompute: a `recomputed<P, SP, R, D>` model over the policy.
template <class F>
concept plans_recompute = requires { typename F::template recomputed<F32, false, recompute::Full, Host>; };

// The cost of a setup from the step of ModelOn measured on the Meta device.
template <template <class> class ModelOn, class Strategy, class T>
Candidate measured_cost(const typename ModelOn<Meta<Host>>::config_type& c, const Setup& x, const Cluster& k) {
  const footprint::Run run{.mesh = {.data = x.data, .pipe = x.pipe, .tensor = x.tensor, .expert = x.expert},
                           .micro_batch = x.micro,
                           .micro_batches = x.accumulation,
                           .schedule = x.schedule,
                           .virtual_stages = x.virtual_stages};
  const estimate::Rates rates = cluster_rates<T>(k, x.tensor, x.data, x.pipe, x.expert);
  Candidate out;
  const std::vector<footprint::RankStep> ranks = footprint::measure_bounding<ModelOn, Strategy>(c, run);
  for (const footprint::RankStep& r : ranks) {
    out.peak_bytes = std::max(out.peak_bytes, r.step.total);
    out.state_bytes = std::max(out.state_bytes, r.step.after.total());
  }
  // The whole model on the data x tensor mesh of the layout, on its first rank.
  const MeshShape flat{.data = x.data, .tensor = x.tensor, .expert = x.expert};
  const auto pipe1 = [&](const typename ModelOn<Meta<Host>>::config_type& cfg, std::int64_t micro_batches) {
    const footprint::Run r{.mesh = flat, .micro_batch = x.micro, .micro_batches = micro_batches};
    return estimate::seconds(estimate::work_of(footprint::measure_alone<ModelOn, Strategy>(cfg, r, 0), flat), rates);
  };
  if (x.pipe == 1) {
    out.time = estimate::seconds(estimate::work_of(ranks[0], run.mesh), rates);
    return out;
  }
  const auto cost = [&](std::int64_t layers, std::int64_t micro_batches) {
    auto cfg = c;
    cfg.layers = layers;
    return pipe1(cfg, micro_batches).total();
  };
  // One activation between pipe neighbours: the largest send of the first pipe rank's step; the
  // tied table's gradient all-reduce between the first and the last pipe rank (its tie group's
  // calls). The pipe axis's all-reduces of a scalar (the loss, the gradient norm) are not priced,
  // as GPT-2's closed forms do not price them.
  const estimate::Link link = k.pipe_link(x.tensor, x.pipe);
  std::uint64_t message = 0;
  double tied = 0;
  for (const auto& [call, n] : ranks[0].calls[static_cast<std::size_t>(Axis::pipe)])
    if (call.first == threads::Op::send) message = std::max(message, call.second);
  for (const auto& [call, n] : ranks[0].tie_calls)
    if (call.first == threads::Op::all_reduce)
      tied += static_cast<double>(n) *
              estimate::collective_seconds(Collective::all_reduce, 2, static_cast<std::int64_t>(call.second), link);
  const pipeline::Table table =
      pipeline::make_table(x.schedule, x.pipe, static_cast<int>(x.accumulation), x.virtual_stages);
  const estimate::PipelineTime pt =
      estimate::pipeline_seconds_of(cost, c.layers, table, link.alpha + static_cast<double>(message) * link.beta, tied);
  share_over_pipe(out, pipe1(c, x.accumulation), pt, x.pipe);
  return out;
}

// The family's cost of a setup in precision `dtype`: its own, or the measured one.
template <Family F>
Candidate cluster_cost(const config_t<F>& c, const Setup& x, const Cluster& k, const std::string& dtype) {
  // A layout whose plan would replay more passes than a plan makes in seconds is left out, saying so.
  if (const auto why = plan_too_long(c.layers, x.accumulation))
    throw Error("plan", *why, "use fewer micro-batches per step (a larger --micro, fewer sequences in --batch)");
  if constexpr (requires {
                  { F::cluster_cost(c, x, k, dtype) } -> std::same_as<Candidate>;
                }) {
    return F::cluster_cost(c, x, k, dtype);
  } else {
    return with_strategy(strategies_t<F>{}, x.strategy, [&]<class S, bool SP>() {
      return with_precision(cluster_precisions_t<F>{}, dtype, [&]<class P>() {
        using T = typename precision_t<P>::compute;
        if constexpr (plans_recompute<F>) {
          if (x.recompute)
            return measured_cost<detail::MetaRecomputed<F, P, SP, recompute::Full>::template on, S, T>(c, x, k);
        }
        return measured_cost<ModelOn<F, P, SP>::template on, S, T>(c, x, k);
      });
    });
  }
}

// Every layout of the run, costed by the family and ranked.
template <Family F>
Candidates plan_cluster(const config_t<F>& c, const Cluster& k, std::int64_t batch, std::int64_t micro_per_gpu,
                        const std::string& dtype) {
  Space space{.strategies = strategy_names(strategies_t<F>{}), .recompute = plans_recompute<F>, .layers = c.layers};
  if constexpr (requires { c.experts; }) space.experts = c.experts;  // a mixture of experts: its expert degrees
  return search(space, k, batch, micro_per_gpu, [&](const Setup& x) { return cluster_cost<F>(c, x, k, dtype); });
}

// A cluster description (JSON, the keys of Cluster but gpus) into k.
inline void read_cluster(const std::string& path, Cluster& k, const std::string& program) {
  // A regular file (a FIFO would block the read) of at most 1 MiB, nested at most 4 deep (values are
  // numbers: JSON's printing of a deep value, in an error message, would overflow the stack).
  const std::string where = cat(program, " --cluster");
  const std::string text = read_text_file(path, 1 << 20, where);
  check_json_limits(text, {.max_bytes = 1 << 20, .max_depth = 4}, cat(where, " '", path, "'"));
  nlohmann::json j;
  std::set<std::string> keys;
  std::string twice;  // a key given twice (JSON's parser would keep the last silently)
  try {
    j = nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second &&
          twice.empty())
        twice = parsed.get<std::string>();
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw Error(where, cat("'", path, "' is not JSON: ", e.what()), "write an object of the documented keys");
  }
  if (!j.is_object()) throw Error(where, cat("'", path, "' is not a JSON object"), "write {\"gpus_per_node\": 8, ...}");
  if (!twice.empty()) throw Error(where, cat("'", path, "' gives ", brief(twice), " twice"), "give each key once");
  // Each number within what a machine can be: a positive memory, rates and latencies that a step's
  // time can be computed from (1e300 us of latency made the search run for ever), efficiencies of a
  // peak at most 1.
  auto number = [&](const char* key, double& v, double lo, double hi) {
    if (!j.contains(key)) return;
    if (!j[key].is_number() || !std::isfinite(j[key].get<double>()) || j[key].get<double>() < lo ||
        j[key].get<double>() > hi)
      throw Error(where, cat("'", path, "': ", key, " is ", j[key].dump()), cat("give a number from ", lo, " to ", hi));
    v = j[key].get<double>();
  };
  if (j.contains("gpus_per_node")) {
    const auto& g = j["gpus_per_node"];
    if (!g.is_number_integer() || g.get<std::int64_t>() < 1 || g.get<std::int64_t>() > 1024)
      throw Error(where, cat("'", path, "': gpus_per_node is ", g.dump()), "give a whole number from 1 to 1024");
    k.gpus_per_node = g.get<int>();
  }
  number("memory_gib", k.memory_gib, 1e-6, 1e9);
  number("peak_tflops", k.peak_tflops, 1e-6, 1e9);
  number("fp8_tflops", k.fp8_tflops, 1e-6, 1e9);
  number("hbm_gbps", k.hbm_gbps, 1e-6, 1e9);
  number("intra_gbps", k.intra_gbps, 1e-6, 1e9);
  number("intra_us", k.intra_us, 0, 1e9);
  number("inter_gbps", k.inter_gbps, 1e-6, 1e9);
  number("inter_us", k.inter_us, 0, 1e9);
  number("gemm_efficiency", k.gemm_efficiency, 1e-6, 1);
  number("attention_efficiency", k.attention_efficiency, 1e-6, 1);
  for (const auto& [key, v] : j.items()) {
    static const std::vector<std::string> known{
        "gpus_per_node", "memory_gib", "peak_tflops",     "fp8_tflops",          "hbm_gbps", "intra_gbps", "intra_us",
        "inter_gbps",    "inter_us",   "gemm_efficiency", "attention_efficiency"};
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw Error(where, cat("'", path, "': unknown key '", key, "'"),
                  "use gpus_per_node, memory_gib, peak_tflops, fp8_tflops, hbm_gbps, intra_gbps, intra_us, "
                  "inter_gbps, inter_us, gemm_efficiency, attention_efficiency");
  }
}

namespace detail {

inline std::string gib(double b) { return cat(std::round(b / (1 << 30) * 100) / 100); }

// What plan_main was asked.
struct PlanOptions {
  std::string model, preset, cluster_file, dtype;
  Sizes sizes;
  std::int64_t batch = 512, micro = 1;
  int show = 12;
  bool json = false;
};

// The preset weft-plan plans: the one given, or the family's preset for clusters, or its first.
template <Family F>
std::string plan_preset(const PlanOptions& o) {
  if (!o.preset.empty()) return o.preset;
  if constexpr (requires {
                  { F::cluster_preset() } -> std::convertible_to<std::string>;
                })
    return F::cluster_preset();
  else return F::preset_names().front();
}

// The precision a cluster plan uses: --dtype, or bf16 where the family plans it, or its first.
template <Family F>
std::string plan_dtype(const PlanOptions& o, const std::string& program) {
  const auto dtypes = dtype_names(cluster_precisions_t<F>{});
  const std::string dtype = !o.dtype.empty()                                                  ? o.dtype
                            : std::find(dtypes.begin(), dtypes.end(), "bf16") != dtypes.end() ? std::string("bf16")
                                                                                              : dtypes.front();
  if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end())
    throw Error(cat(program, " --dtype"),
                cat("precision '", dtype, "' is not planned for the model family '", F::name(), "'"),
                cat("use one of: ", join(dtypes)));
  return dtype;
}

// Sizes whose element counts would overflow the plan's 64-bit counts, and a micro-batch larger than
// the batch on these GPUs, refused before anything is planned.
template <Family F>
void check_plan_sizes(const PlanOptions& o, const config_t<F>& c, const Cluster& k, const std::string& program) {
  if constexpr (requires { approximate_elements(c, 1.0, 1.0); }) {  // the family's, found beside its config
    const double elements = approximate_elements(c, static_cast<double>(o.micro), k.gpus_per_node);
    if (elements > footprint::kMaxElements)
      throw Error(program,
                  cat("layers ", c.layers, ", width ", c.width, ", seq ", c.seq, ", vocab ", c.vocab, ", --micro ",
                      o.micro, ": about ", elements, " elements per GPU"),
                  "use a smaller model, sequence or micro-batch");
  }
  if (static_cast<double>(o.micro) * k.gpus > static_cast<double>(o.batch))
    throw Error(program,
                cat("--micro ", o.micro, " on ", k.gpus, " GPUs is ", static_cast<double>(o.micro) * k.gpus,
                    " sequences per micro-batch, more than the batch of ", o.batch),
                "raise --batch or lower --micro or --gpus");
}

// One candidate: a JSON line, or a row of the table.
inline void print_candidate(const Candidate& x, const Cluster& k, double tokens, double flops, bool json) {
  const Setup& l = x.setup;
  const double t = x.step_seconds();
  const double mfu = flops / t / (k.gpus * k.peak_tflops * 1e12);
  if (json) {
    const nlohmann::json j{{"strategy", l.name()},
                           {"tensor", l.tensor},
                           {"data", l.data},
                           {"expert", l.expert},
                           {"pipe", l.pipe},
                           {"schedule", l.schedule_name()},
                           {"pipeline_s", x.pipeline_s},
                           {"micro_batch", l.micro},
                           {"accumulation", l.accumulation},
                           {"peak_bytes", x.peak_bytes},
                           {"state_bytes", x.state_bytes},
                           {"workspace_bytes", x.workspace_bytes},
                           {"fits", x.fits},
                           {"step_s", t},
                           {"gemm_s", x.time.gemm},
                           {"attention_s", x.time.attention},
                           {"elementwise_s", x.time.elementwise},
                           {"memory_s", x.time.memory},
                           {"tensor_comm_s", x.time.tensor_comm},
                           {"data_comm_s", x.time.data_comm},
                           {"expert_comm_s", x.time.expert_comm},
                           {"tokens_per_s", tokens / t},
                           {"mfu", mfu}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  const std::string pipe = l.pipe > 1 ? cat(l.pipe, " ", l.schedule_name()) : "1";
  const std::string data = l.expert > 1 ? cat(l.data, " e", l.expert) : cat(l.data);
  std::printf("%-22s %6d %10s %8s %6lld %11s %11s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10.4g %5.1f%%%s\n",
              l.name().c_str(), l.tensor, pipe.c_str(), data.c_str(), static_cast<long long>(l.accumulation),
              gib(static_cast<double>(x.peak_bytes)).c_str(), gib(static_cast<double>(x.state_bytes)).c_str(), 1e3 * t,
              1e3 * x.time.gemm, 1e3 * x.time.attention, 1e3 * (x.time.elementwise + x.time.memory),
              1e3 * (x.time.tensor_comm + x.time.data_comm + x.time.expert_comm), 1e3 * x.pipeline_s, tokens / t,
              100 * mfu, x.fits ? "" : "  (does not fit)");
}

// The table's closing note: what the peak is, what is not priced, and the setups left out.
template <Family F>
void print_plan_note(const config_t<F>& c, const Candidates& found) {
  std::string peak;
  if constexpr (requires {
                  { F::cluster_peak_note(c) } -> std::convertible_to<std::string>;
                })
    peak = F::cluster_peak_note(c);
  else
    peak =
        "the step's peak per GPU measured on the Meta device (the host allocator's counts, without the CUDA back end's workspaces)";
  constexpr bool own = requires(const config_t<F>& cc, const Setup& l, const Cluster& kk, const std::string& d) {
    F::cluster_cost(cc, l, kk, d);
  };
  std::printf(
      "(ranked by step time among those that fit; peak: %s; pipe: degree and schedule, the largest pipe rank's "
      "peak (int2: interleaved, 2 virtual stages);%s pipeline: the schedule's idle time, messages and imbalance; "
      "no overlap of communication with compute%s)\n",
      peak.c_str(),
      found.list.empty() ||
              std::none_of(found.list.begin(), found.list.end(), [](const Candidate& x) { return x.setup.expert > 1; })
          ? ""
          : " data: degree, and e N its expert degree (the expert group: N of its ranks, whose all-to-all is in comm);",
      own ? "" : "; the family's own ops not priced");
  if (found.skipped.empty()) return;
  std::printf("left out:\n");
  for (const std::string& why : found.skipped) std::printf("  %s\n", why.c_str());
}

template <Family F>
int plan_family(const PlanOptions& given, Cluster k, const std::string& program) {
  PlanOptions o = given;
  o.preset = plan_preset<F>(o);
  const std::string dtype = plan_dtype<F>(o, program);
  const config_t<F> c = preset_config<F>(program, o.preset, o.sizes);
  check_plan_sizes<F>(o, c, k, program);
  const Candidates found = plan_cluster<F>(c, k, o.batch, o.micro, dtype);
  const double tokens = static_cast<double>(o.batch) * static_cast<double>(c.seq);
  const double flops = family_flops_per_token<F>(c) * tokens;
  if (!o.json)
    std::printf(
        "%s: %s%s, %s | %d GPUs (%d per node, %.0f GiB, %.0f TFLOP/s) | batch %lld, %lld per GPU per micro-batch\n",
        program.c_str(), cat(F::name(), ": ").c_str(), summary<F>(c).c_str(), dtype.c_str(), k.gpus, k.gpus_per_node,
        k.memory_gib, k.peak_tflops, static_cast<long long>(o.batch), static_cast<long long>(o.micro));
  if (found.list.empty()) {  // in text or JSON, the reasons on stderr
    std::fprintf(stderr,
                 "%s: no candidate: no layout with a tensor degree up to %d fits the sizes; change --gpus, --micro "
                 "or the model's sizes\n",
                 program.c_str(), k.gpus_per_node);
    for (const std::string& why : found.skipped) std::fprintf(stderr, "  %s\n", why.c_str());
    return 2;
  }
  if (!o.json)
    std::printf("%-22s %6s %10s %8s %6s %11s %11s %9s %9s %9s %9s %9s %9s %10s %6s\n", "strategy", "tensor", "pipe",
                "data", "accum", "peak GiB", "state GiB", "step ms", "gemm", "attn", "elemwise", "comm", "pipeline",
                "tokens/s", "MFU");
  for (std::size_t i = 0; i < found.list.size() && static_cast<std::int64_t>(i) < o.show; ++i)
    print_candidate(found.list[i], k, tokens, flops, o.json);
  if (!o.json) print_plan_note<F>(c, found);
  return 0;
}

}  // namespace detail

// weft-plan's command line over the families of the list (--model; the first by default). Each
// family is planned in the variant its preset's configuration asks for (its tied head), without
// context parallelism.
template <class... Fs>
int plan_main_of(List<Fs...> families, int argc, char** argv, const std::string& program) {
  detail::PlanOptions o;
  Cluster k;
  const std::vector<std::string> models{Fs::name()...};
  CLI::App app{cat(program, ": memory and step time of a model on a cluster, for every compiled strategy and layout")};
  app.add_option("--model", o.model, "model family")->check(CLI::IsMember(models));
  app.add_option("--preset", o.preset, "the family's preset (default: its cluster preset, gpt2-124m for GPT-2)");
  cli::add_sizes(app, o.sizes);
  app.add_option("--dtype", o.dtype, "bf16 (mixed, f32 master), f32, ...: the family's (default bf16 where it has it)");
  app.add_option("--gpus", k.gpus, "GPUs in all")->check(cli::at_least(1))->check(cli::at_most(1 << 20));
  app.add_option("--batch", o.batch, "global batch, in sequences")->check(cli::at_least(1));
  app.add_option("--micro", o.micro, "sequences per GPU per micro-batch")->check(cli::at_least(1));
  app.add_option("--cluster", o.cluster_file,
                 "JSON: gpus_per_node, memory_gib, peak_tflops, fp8_tflops, hbm_gbps, intra_gbps, intra_us, "
                 "inter_gbps, inter_us, gemm_efficiency, attention_efficiency (defaults: 8 x H200 "
                 "nodes, NVLink, 400 Gb/s InfiniBand per GPU)");
  app.add_option("--gpus-per-node", k.gpus_per_node, "overrides the cluster's")
      ->check(cli::at_least(1))
      ->check(cli::at_most(1024));
  app.add_option("--memory-gib", k.memory_gib, "device memory, overrides the cluster's")->check(cli::above(0));
  app.add_option("--peak-tflops", k.peak_tflops, "dense peak, overrides the cluster's")->check(cli::above(0));
  app.add_option("--show", o.show, "candidates to print")->check(cli::at_least(1));
  app.add_flag("--json", o.json, "one JSON object per candidate instead of the table");
  if (const auto rc = cli::parse(app, argc, argv)) return *rc;
  try {
    if (!o.cluster_file.empty()) {
      const Cluster given = k;
      read_cluster(o.cluster_file, k, program);
      // Options given on the command line win over the file.
      if (app.count("--gpus-per-node")) k.gpus_per_node = given.gpus_per_node;
      if (app.count("--memory-gib")) k.memory_gib = given.memory_gib;
      if (app.count("--peak-tflops")) k.peak_tflops = given.peak_tflops;
    }
    return with_family(families, o.model, cat(program, " --model"), [&]<class F>() {
      Wanted w;
      if constexpr (requires(config_t<F> c) {
                      { c.tied } -> std::convertible_to<bool>;
                    })
        w.tied = preset_config<F>(program, detail::plan_preset<F>(o), o.sizes).tied;
      int out = 2;
      bool listed = false;
      [&]<class... V>(List<V...>) {
        (void)((w.is<V>() ? (listed = true, out = detail::plan_family<Bound<F, V>>(o, k, program), true) : false) ||
               ...);
      }(variants_t<F>{});
      if (!listed)
        throw Error(
            cat(program, " --tie-embeddings"),
            cat("the model family '", F::name(), "' has no model with ", w.tied ? "a tied" : "an untied", " LM head"),
            cat("give --tie-embeddings ", w.tied ? "false" : "true"));
      return out;
    });
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

// weft-plan over the families First, Rest... (a user's planner in one line).
template <Family First, Family... Rest>
int plan_main(int argc, char** argv, const std::string& program) {
  return plan_main_of(List<First, Rest...>{}, argc, argv, program);
}

}  // namespace weft::train
