// GPT-2 for the trainer (concept train::Family, train/family.hpp): the model over the precision,
// the sequence parallelism, the device and the variant, the presets, the FLOPs per token, the
// Hugging Face import (--init-from), and the plain variant's plan (--plan and the check that a run fits; defined in
// models/gpt2/run_plan.hpp, which only the command line's translation unit includes).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "weft/core/float8_gemms.hpp"
#include "weft/core/precision.hpp"
#include "weft/cost/memory.hpp"
#include "weft/models/gpt2/config.hpp"
#include "weft/models/gpt2/footprint.hpp"
#include "weft/models/gpt2/hf.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/train/family.hpp"
#include "weft/train/rank_plan.hpp"

namespace weft::train {
struct Options;  // train/options.hpp: the closed-form plan's definitions (run_plan.hpp) read it
struct Setup;
struct Cluster;
struct Candidate;
}  // namespace weft::train

namespace weft::gpt2 {

// One pipe rank's plan of a run (the persistent state, the peak of a step).
using RankPlan = train::RankPlan;

struct Family {
  template <class P, bool SP, class D, class V>
  using model = Model<P, SP, recompute::None, D, typename V::context>;
  // The sequence over the context axis (--context, ring or all-gather attention): f32 on the host,
  // every data strategy and pipeline schedule, planned on the Meta device (the closed forms below
  // do not know the axis). GPT-2's head always reads the embedding table: no `tied` choice.
  using variants = train::List<train::Variant<>, train::Variant<context::Ring>, train::Variant<context::AllGather>>;
  template <class P, bool SP, class R, class D>
  using recomputed = Model<P, SP, R, D>;
  // f32, bf16, f64 and FP8 (--dtype fp8-tensorwise, fp8-rowwise, fp8-blockwise: the linear layers'
  // GEMMs on float8 casts, core/float8_gemms.hpp) on the host; f32 and bf16 on the GPU.
  using host_precisions = train::List<F32, Bf16Mixed, F64, Fp8Tensorwise, Fp8Rowwise, Fp8Blockwise>;

  static std::string name() { return "gpt2"; }
  static std::vector<std::string> preset_names() { return gpt2::preset_names(); }
  static Config preset(std::string_view n) { return gpt2::preset(n); }
  static double flops_per_token(const Config& c) { return gpt2::flops_per_token(c); }
  static std::string summary(const Config& c) {
    return cat("layers ", c.layers, ", heads ", c.heads, ", width ", c.width, ", seq ", c.seq, ", vocab ", c.vocab);
  }
  static void import_hf(const std::string& file, const std::string& dir, const Config& c) {
    gpt2::import_hf(file, dir, c);
  }
  // weft-export: a safetensors file in F32 (config.json beside it) that GPT2LMHeadModel loads.
  static Config config_of(const checkpoint::Manifest& m) { return gpt2::config_of(m); }
  static void export_hf(const std::string& checkpoint, const std::string& out, const checkpoint::ExportOptions& e) {
    if ((e.dtype && *e.dtype != DType::f32) || e.max_shard_bytes)
      throw Error("weft-export", "--dtype and --max-shard-bytes are for Llama checkpoints; this one is GPT-2's",
                  "leave them out (GPT-2 is exported in F32, as one file)");
    gpt2::export_hf(checkpoint, out);
  }
  // models/gpt2/run_plan.hpp
  static std::vector<RankPlan> plan(const train::Options& o, const Config& c, bool host);
  static int print_plan(const train::Options& o, const Config& c, const std::string& device);
  // weft-plan's cost of a layout on a cluster, in bf16, f32 or FP8 (models/gpt2/cluster_plan.hpp)
  using cluster_precisions = train::List<Bf16Mixed, F32, Fp8Tensorwise, Fp8Rowwise, Fp8Blockwise>;
  static train::Candidate cluster_cost(const Config& c, const train::Setup& x, const train::Cluster& k,
                                       const std::string& dtype);
  static std::string cluster_preset() { return "gpt2-124m"; }
  static std::string cluster_peak_note(const Config& c);
};

}  // namespace weft::gpt2
