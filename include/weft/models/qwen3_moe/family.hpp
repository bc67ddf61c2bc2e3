// Qwen3-MoE for the trainer (concept train::Family, train/family.hpp): weft-train --model qwen3-moe.
// As Mixtral's (models/mixtral/family.hpp): the model over the precision, the sequence parallelism
// and the device, all-to-all dispatch, --expert N, the routers in the log, the plan measured on the
// Meta device at a balanced routing, host only in f32 and bf16; presets "tiny" (qwen3-moe-tiny) and
// Qwen3-30B-A3B's sizes; --init-from a transformers Qwen3MoeForCausalLM directory (its dense layers
// too: mlp_only_layers, decoder_sparse_step) and weft-export to one (models/qwen3_moe/hf.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/models/mixtral/family.hpp"
#include "weft/models/qwen3_moe/hf.hpp"
#include "weft/models/qwen3_moe/model.hpp"
#include "weft/train/family.hpp"

namespace weft::qwen3_moe {

// The named sizes: qwen3-moe-tiny for tests and demos (mixtral-tiny's, with heads of 32, twice width
// / heads, and the top 2 not renormalised), and Qwen3-30B-A3B's (its config.json: 48 layers, width
// 2048, 32 heads of 128 over 4 key-value heads, 128 experts of width 768, the top 8 renormalised,
// rope theta 10^6, rms eps 10^-6) at a sequence of 4096 for --plan.
inline std::vector<std::string> preset_names() { return {"qwen3-moe-tiny", "qwen3-30b-a3b"}; }
inline Config preset(std::string_view name) {
  Config c;
  if (name == "qwen3-moe-tiny") {
    static_cast<mixtral::Config&>(c) = mixtral::preset("mixtral-tiny");
    c.head_size = 32;
    c.norm_eps = 1e-6;
    c.norm_topk_prob = false;
    return c;
  }
  if (name == "qwen3-30b-a3b") {
    static_cast<llama::Config&>(c) = {.vocab = 151936,
                                      .seq = 4096,
                                      .layers = 48,
                                      .heads = 32,
                                      .kv_heads = 4,
                                      .width = 2048,
                                      .hidden = 768,
                                      .rope = {.theta = 1e6},
                                      .norm_eps = 1e-6};
    c.head_size = 128;
    c.experts = 128;
    c.top_k = 8;
    c.norm_topk_prob = true;
    c.aux_coef = 0.001;
    return c;
  }
  throw Error("qwen3_moe::preset", cat("no preset named \"", name, "\""), "use qwen3-moe-tiny or qwen3-30b-a3b");
}

// Model FLOPs per token of a training step, 6 N + 12 L C T (train/flops.hpp), N the parameters a
// token is computed with: the attention's (heads of head_dim), in a sparse layer the router's and its
// top k experts', in a dense layer its MLP's, the embedding table and the head. (The second term
// keeps every weft model's form, over the width.)
inline double flops_per_token(const Config& c) {
  const double C = static_cast<double>(c.width), L = static_cast<double>(c.layers), F = static_cast<double>(c.hidden);
  const double hd = static_cast<double>(c.head_dim()), H = static_cast<double>(c.heads),
               KV = static_cast<double>(c.kv_heads);
  const double E = static_cast<double>(c.experts), k = static_cast<double>(c.top_k);
  const double dense = static_cast<double>(c.dense_layers().size()), Fd = static_cast<double>(c.dense_width());
  const double active = L * (2 * C * H * hd + 2 * C * KV * hd) + (L - dense) * (E * C + k * 3 * C * F) +
                        dense * 3 * C * Fd + static_cast<double>(c.vocab) * C * (c.tied ? 1 : 2);
  return 6.0 * active + 12.0 * L * C * static_cast<double>(c.seq);
}

struct Family {
  template <class P, bool SP, class D>
  using model = Model<P, SP, recompute::None, D, nn::AllToAllDispatch, nn::ExpertTensor::sharded>;  // as Mixtral's
  using host_precisions = train::List<F32, Bf16Mixed>;
  using cluster_precisions = train::List<Bf16Mixed>;  // weft-plan's: bf16 (half weft-plan's compile of the family)
  static constexpr bool gpu = false;                  // weft-train's GPU units for Qwen3-MoE: not yet

  static std::string name() { return "qwen3-moe"; }
  static std::vector<std::string> preset_names() { return {"tiny", "qwen3-moe-tiny", "qwen3-30b-a3b"}; }
  static std::string cluster_preset() { return "qwen3-30b-a3b"; }  // weft-plan --model qwen3-moe's default
  static Config preset(std::string_view n) { return qwen3_moe::preset(n == "tiny" ? "qwen3-moe-tiny" : n); }
  static double flops_per_token(const Config& c) { return qwen3_moe::flops_per_token(c); }
  static std::string summary(const Config& c) {
    return cat(
        "layers ", c.layers, ", heads ", c.heads, " of ", c.head_dim(), " (", c.kv_heads,
        " key-value, QK norm), width ", c.width, ", ", c.experts, " experts of width ", c.hidden, " (top ", c.top_k,
        c.norm_topk_prob ? ", renormalised" : "", c.score == nn::Score::sigmoid ? ", by sigmoid scores" : "",
        c.expert_bias ? cat(", an expert bias at rate ", c.bias_rate) : "",
        c.groups != 1 ? cat(", from ", c.top_groups, " of ", c.groups, " groups") : "", ")",
        c.dense_layers().empty() ? ""
                                 : cat(", dense layers ", join(c.dense_layers(), ","), " of width ", c.dense_width()),
        ", aux coef ", c.aux_coef, ", seq ", c.seq, ", vocab ", c.vocab, ", rope theta ", c.rope.theta);
  }
  // --init-from DIR without --preset: the model config.json describes, its experts checked against
  // the router's tensors.
  static Config config_from_hf(const std::string& from, const Config& base) {
    const Config c = qwen3_moe::hf_config_of(from, base);
    check_experts(from, c);
    return c;
  }
  // --init-from DIR: its config.json must describe the run's model (as Mixtral's, mixtral::Family).
  static void import_hf(const std::string& from, const std::string& dir, const Config& c) {
    const Config got = mixtral::same_model(c, qwen3_moe::hf_config_of(from, c), cat("qwen3_moe::import(", from, ")"));
    check_experts(from, got);
    qwen3_moe::import_hf(from, dir, got);
  }
  static Config config_of(const checkpoint::Manifest& m) { return qwen3_moe::config_of(m); }
  static void export_hf(const std::string& checkpoint, const std::string& out, const checkpoint::ExportOptions& e) {
    qwen3_moe::export_hf(checkpoint, out, e.dtype.value_or(DType::f32), e.max_shard_bytes.value_or(5'000'000'000));
  }
};

}  // namespace weft::qwen3_moe
