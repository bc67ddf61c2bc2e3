// Mixtral for the trainer (concept train::Family, train/family.hpp): weft-train --model mixtral. The
// model over the precision, the sequence parallelism and the device (all-to-all dispatch; the
// all-gather dispatcher is the library's, mixtral::Model<..., nn::AllGatherDispatch>); the presets
// ("tiny" is mixtral-tiny; Mixtral 8x7B's sizes for --plan); the FLOPs of a token's active
// parameters. --expert N shards each layer's experts over groups of N data x context ranks, and
// --tensor N splits each expert over the tensor ranks (docs/moe.md); the log carries the routers' aux loss, expert load
// and dropped slots (train/report.hpp). The plan (--plan, and the check that a run fits) is the step measured on the
// Meta device, with every expert given the same share of the tokens (nn/moe.hpp). On the host only,
// in f32 and bf16 (f64 is the tests' precision). --init-from a transformers MixtralForCausalLM
// directory (without --preset: the model its config.json describes) and weft-export to one
// (models/mixtral/hf.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/models/mixtral/hf.hpp"
#include "weft/models/mixtral/model.hpp"
#include "weft/train/family.hpp"

namespace weft::mixtral {

// The named sizes: mixtral-tiny for tests and demos (llama-tiny's blocks, 4 experts of width 64, the
// top 2), and Mixtral 8x7B's (its config.json: 8 experts, the top 2, router_aux_loss_coef 0.02,
// rope theta 10^6) at a sequence of 4096 for --plan.
inline std::vector<std::string> preset_names() { return {"mixtral-tiny", "mixtral-8x7b"}; }
inline Config preset(std::string_view name) {
  Config c;
  if (name == "mixtral-tiny") {
    static_cast<llama::Config&>(c) = llama::preset("llama-tiny");
    c.hidden = 64;
    c.experts = 4;
    c.top_k = 2;
    c.aux_coef = 0.01;
    return c;
  }
  if (name == "mixtral-8x7b") {
    static_cast<llama::Config&>(c) = {.vocab = 32000,
                                      .seq = 4096,
                                      .layers = 32,
                                      .heads = 32,
                                      .kv_heads = 8,
                                      .width = 4096,
                                      .hidden = 14336,
                                      .rope = {.theta = 1e6}};
    c.experts = 8;
    c.top_k = 2;
    c.aux_coef = 0.02;
    return c;
  }
  throw Error("mixtral::preset", cat("no preset named \"", name, "\""), "use mixtral-tiny or mixtral-8x7b");
}

// Model FLOPs per token of a training step, 6 N + 12 L C T as every weft model's (train/flops.hpp),
// with N the parameters a token is computed with: the attention's, the router's, its top k experts'
// (of the E), the embedding table and the head.
inline double flops_per_token(const Config& c) {
  const double C = static_cast<double>(c.width), L = static_cast<double>(c.layers);
  const double F = static_cast<double>(c.hidden), kv = static_cast<double>(c.kv_heads * c.head_dim());
  const double E = static_cast<double>(c.experts), k = static_cast<double>(c.top_k);
  const double active =
      L * (2 * C * C + 2 * C * kv + E * C + k * 3 * C * F) + static_cast<double>(c.vocab) * C * (c.tied ? 1 : 2);
  return 6.0 * active + 12.0 * L * C * static_cast<double>(c.seq);
}

// `got` (a directory's config.json) with the run's router coefficients and capacity, which train the
// same weights; refused, naming the first field of the record that differs, where it is another
// model than the run's `c` (an MoE family's import_hf: this one's, qwen3_moe::Family's).
template <class C>
C same_model(const C& c, C got, const std::string& where) {
  check_hf_router(c, where);
  got.aux_coef = c.aux_coef, got.z_coef = c.z_coef, got.capacity_factor = c.capacity_factor;
  const auto want = record(c), have = record(got);
  for (std::size_t i = 0; i < std::max(want.size(), have.size()); ++i)
    if (i >= want.size() || i >= have.size() || want[i] != have[i])
      throw Error(
          where,
          i < want.size() && i < have.size()
              ? cat("its config.json has ", have[i].first, " ", have[i].second, "; the run's model has ",
                    want[i].second)
              : cat("its config.json has ", i < have.size() ? have[i].first : want[i].first, " ",
                    i < have.size() ? "set" : "unset", "; the run's model has it ", i < have.size() ? "unset" : "set"),
          "choose the preset and sizes of the model in the directory (--layers, --width, --heads, "
          "--kv-heads, --hidden, --vocab, --experts, --top-k), or leave out --preset");
  return got;
}

struct Family {
  template <class P, bool SP, class D>
  // The experts split over the tensor ranks (expert-tensor parallelism, Megatron-Core's default of
  // an expert tensor degree equal to the tensor degree): with --tensor N each rank holds 1/N of its
  // experts' weights, as of the attention's (nn/moe.hpp; the library keeps whole experts too).
  using model = Model<P, SP, recompute::None, D, nn::AllToAllDispatch, context::None, nn::ExpertTensor::sharded>;
  using host_precisions = train::List<F32, Bf16Mixed>;
  using cluster_precisions = train::List<Bf16Mixed>;  // weft-plan's: bf16 (half weft-plan's compile of the family)
  static constexpr bool gpu = false;  // weft-train's GPU units for Mixtral: not yet (tests/nn/gpu.cu has the layer)

  static std::string name() { return "mixtral"; }
  static std::vector<std::string> preset_names() { return {"tiny", "mixtral-tiny", "mixtral-8x7b"}; }
  static std::string cluster_preset() { return "mixtral-8x7b"; }  // weft-plan --model mixtral's default
  static Config preset(std::string_view n) { return mixtral::preset(n == "tiny" ? "mixtral-tiny" : n); }
  static double flops_per_token(const Config& c) { return mixtral::flops_per_token(c); }
  static std::string summary(const Config& c) {
    return cat("layers ", c.layers, ", heads ", c.heads, " (", c.kv_heads, " key-value), width ", c.width, ", ",
               c.experts, " experts of width ", c.hidden, " (top ", c.top_k,
               c.score == nn::Score::sigmoid ? " by sigmoid scores" : "",
               c.expert_bias ? cat(", an expert bias at rate ", c.bias_rate) : "",
               c.groups != 1 ? cat(", from ", c.top_groups, " of ", c.groups, " groups") : "", "), aux coef ",
               c.aux_coef, ", seq ", c.seq, ", vocab ", c.vocab, ", rope theta ", c.rope.theta);
  }
  // --init-from DIR without --preset: the model config.json describes (base's sequence and seed), its
  // expert count checked against the router's tensors.
  static Config config_from_hf(const std::string& from, const Config& base) {
    const Config c = mixtral::hf_config_of(from, base);
    check_experts(from, c);
    return c;
  }
  // --init-from DIR: its config.json must describe the run's model (every field of the record but
  // the router's coefficients and capacity, which train the same weights; the first that differs is
  // named).
  static void import_hf(const std::string& from, const std::string& dir, const Config& c) {
    const Config got = same_model(c, mixtral::hf_config_of(from, c), cat("mixtral::import(", from, ")"));
    check_experts(from, got);
    mixtral::import_hf(from, dir, got);
  }
  // weft-export: a MixtralForCausalLM directory, in F32 or F64 (exact), sharded as save_pretrained
  // shards past 5 GB or the given size.
  static Config config_of(const checkpoint::Manifest& m) { return mixtral::config_of(m); }
  static void export_hf(const std::string& checkpoint, const std::string& out, const checkpoint::ExportOptions& e) {
    mixtral::export_hf(checkpoint, out, e.dtype.value_or(DType::f32), e.max_shard_bytes.value_or(5'000'000'000));
  }
};

}  // namespace weft::mixtral
