// GPT-2 for the trainer (concept train::Family, train/family.hpp): the model over the precision,
// the sequence parallelism and the device, the presets, the FLOPs per token, the Hugging Face
// import (--init-from), and the plan (--plan and the check that a run fits; defined in
// models/gpt2/run_plan.hpp, which only the command line's translation unit includes).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/models/gpt2/config.hpp"
#include "weft/models/gpt2/hf.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/plan/memory.hpp"
#include "weft/train/family.hpp"
#include "weft/train/options.hpp"
#include "weft/train/rank_plan.hpp"

namespace weft::train {
struct Layout;
struct Cluster;
struct Candidate;
}  // namespace weft::train

namespace weft::gpt2 {

// One pipe rank's plan of a run (the persistent state, the peak of a step).
using RankPlan = train::RankPlan;

template <context::Kind Cx>
struct ContextFamily;

// What GPT-2's families share: the name, the presets, the FLOPs, the summary, the import.
struct Common {
  static std::string name() { return "gpt2"; }
  static std::vector<std::string> preset_names() { return gpt2::preset_names(); }
  static Config preset(std::string_view n) { return gpt2::preset(n); }
  static double flops_per_token(const Config& c) { return gpt2::flops_per_token(c); }
  static std::string summary(const Config& c) {
    return cat("layers ", c.layers, ", heads ", c.heads, ", width ", c.width, ", seq ", c.seq, ", vocab ", c.vocab);
  }
  static void import_hf(const std::string& file, const std::string& dir, const Config& c) { gpt2::import_hf(file, dir, c); }
};

struct Family : Common {
  template <class P, bool SP, class D>
  using model = Model<P, SP, recompute::None, D>;
  template <class P, bool SP, class R, class D>
  using recomputed = Model<P, SP, R, D>;
  // train_gpt --context N --attention ring|all-gather: the family whose model shards the sequence
  // over the context axis, Cx's way (train/main.hpp trains it in this one's place).
  template <context::Kind Cx>
  using with_context = ContextFamily<Cx>;
  // models/gpt2/run_plan.hpp
  static std::vector<RankPlan> plan(const train::Options& o, const Config& c, bool host);
  static int print_plan(const train::Options& o, const Config& c, const std::string& device);
  // weft-plan's cost of a layout on a cluster, in bf16 or f32 (models/gpt2/cluster_plan.hpp)
  using cluster_precisions = train::List<Bf16Mixed, F32>;
  static train::Candidate cluster_cost(const Config& c, const train::Layout& x, const train::Cluster& k, const std::string& dtype);
  static std::string cluster_preset() { return "gpt2-124m"; }
  static std::string cluster_peak_note(const Config& c);
};

// GPT-2 with the sequence over the context axis (docs/context.md): the host, f32, every data
// strategy and pipeline schedule, with or without sequence parallelism inside it. Its plan is the
// step measured on the Meta device (train/plan.hpp), which counts the context axis; Family's plan
// (the replay of plan/step.hpp) and weft-plan's cluster cost do not know the axis, so this family
// does not take them (it shares Common, not Family).
template <context::Kind Cx>
struct ContextFamily : Common {
  using attention = Cx;
  template <class P, bool SP, class D>
  using model = Model<P, SP, recompute::None, D, Cx>;
  using host_precisions = train::List<F32>;
  static constexpr bool gpu = false;
};

}  // namespace weft::gpt2
