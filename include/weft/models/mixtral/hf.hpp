// Hugging Face Mixtral (transformers' MixtralForCausalLM) in and out: import a model directory as a
// weft checkpoint of its weights, export a weft checkpoint as such a directory. Llama's tensors as
// models/llama/hf.hpp maps them, and each layer's mixture of experts as save_pretrained writes it
// (transformers 5 holds the experts stacked in memory and saves them one by one):
//
//   weft (model.hpp)                          Hugging Face
//   layers.<l>.mlp.router.weight (E, C)       model.layers.<l>.block_sparse_moe.gate.weight
//   layers.<l>.mlp.experts.gate_up            model.layers.<l>.block_sparse_moe.experts.<e>.{w1,w3}.weight
//     (E, 2H, C), expert e's rows (H, {gate, up})   (H, C) each: w1 (gate) row f is weft's row 2f of
//                                                 expert e, w3 (up) row f its row 2f + 1
//   layers.<l>.mlp.experts.down (E, C, H)     model.layers.<l>.block_sparse_moe.experts.<e>.w2.weight
//
// config.json: Llama's fields (models/llama/hf.hpp) under model_type "mixtral", and
// num_local_experts, num_experts_per_tok, router_aux_loss_coef (0.001 where absent). A sliding
// window or router jitter, which weft's Mixtral does not have, is refused by name. An expert count
// that disagrees with the tensors is refused by name: the router's shape, or an expert past it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/models/llama/hf.hpp"
#include "weft/models/mixtral/model.hpp"

namespace weft::mixtral {

namespace hf_detail {
using llama::hf_detail::Named;

// How a family names a layer's mixture of experts: under `prefix` in the layer, the router
// (prefix + "gate.weight") and expert e's gate, up and down (prefix + "experts.<e>.<gate>.weight");
// `count` is config.json's key for the experts.
struct MoeNames {
  std::string prefix, gate, up, down, count;
};
inline const MoeNames mixtral_names{"block_sparse_moe.", "w1", "w3", "w2", "num_local_experts"};

// Layer l's router and experts: (E, C), (E, 2H, C) from E gates and ups, (E, C, H) from E downs.
inline void moe_names(std::vector<Named>& n, const std::string& w, const std::string& h, const MoeNames& m,
                      std::int64_t E, std::int64_t C, std::int64_t H) {
  const std::string moe = h + m.prefix;
  n.push_back(llama::hf_detail::plain(w + "mlp.router.weight", moe + "gate.weight", {E, C}));
  Named gate_up{w + "mlp.experts.gate_up", {}, Named::Kind::expert_gate_up, {E, 2 * H, C}, {}};
  Named down{w + "mlp.experts.down", {}, Named::Kind::expert_stack, {E, C, H}, {}};
  for (std::int64_t e = 0; e < E; ++e) {
    const std::string x = cat(moe, "experts.", e, ".");
    gate_up.hf.push_back(x + m.gate + ".weight");
    gate_up.hf.push_back(x + m.up + ".weight");
    gate_up.parts.push_back({H, C});
    gate_up.parts.push_back({H, C});
    down.hf.push_back(x + m.down + ".weight");
    down.parts.push_back({C, H});
  }
  n.push_back(std::move(gate_up));
  n.push_back(std::move(down));
}

inline std::vector<Named> names(const Config& c) {
  return llama::hf_detail::names_with(
      c, [&](std::vector<Named>& n, std::int64_t, const std::string& w, const std::string& h) {
        moe_names(n, w, h, mixtral_names, c.experts, c.width, c.hidden);
      });
}

// The experts config.json counts against the router's tensors in the directory `dir` (their
// headers only), `who` the importer for errors.
// `sparse(l)`: whether layer l has experts (Qwen3-MoE's dense layers have no router).
template <class Sparse>
void check_experts(const std::string& dir, const std::string& who, const MoeNames& m, std::int64_t layers,
                   std::int64_t experts, Sparse&& sparse) {
  const checkpoint::ImportDir files(dir, "model", cat(who, "(", dir, ")"));
  for (std::int64_t l = 0; l < layers; ++l) {
    const std::string router = cat("model.layers.", l, ".", m.prefix, "gate.weight");
    const checkpoint::TensorInfo* t = files.find(router);
    if (!sparse(l)) {
      if (t)
        throw Error(files.at(),
                    cat("has ", router, ", a router in layer ", l,
                        ", which config.json makes dense (mlp_only_layers, decoder_sparse_step)"),
                    "pass a config.json that matches the weights");
      continue;
    }
    if (!t) throw Error(files.at(), cat("has no tensor ", router), "pass the whole model that config.json describes");
    if (t->shape.size() != 2 || t->shape[0] != experts)
      throw Error(
          files.at(),
          cat(router, " has the shape ", join(t->shape, "x"), ": ", t->shape.empty() ? std::int64_t{0} : t->shape[0],
              " experts, where config.json's ", m.count, " is ", experts),
          "pass a config.json that matches the weights");
  }
}
}  // namespace hf_detail

// The configuration a transformers config.json describes (seq and seed the caller's, as Llama's).
inline Config config_from_hf(const nlohmann::json& j, const std::string& at, const Config& base = {}) {
  Config c = base;
  static_cast<llama::Config&>(c) = llama::config_from_hf(j, at, base, "mixtral", "MixtralForCausalLM");
  const auto integer = [&](const char* k) -> std::int64_t {
    if (!j.contains(k) || !j[k].is_number_integer())
      throw Error(at, j.contains(k) ? cat("has ", k, " ", brief(j[k].dump()), ", not an integer") : cat("has no ", k),
                  "pass a MixtralForCausalLM config.json");
    return j[k].get<std::int64_t>();
  };
  c.experts = integer("num_local_experts");
  c.top_k = integer("num_experts_per_tok");
  c.aux_coef = 0.001;
  if (j.contains("router_aux_loss_coef") && !j["router_aux_loss_coef"].is_null()) {
    if (!j["router_aux_loss_coef"].is_number())
      throw Error(at, cat("has router_aux_loss_coef ", brief(j["router_aux_loss_coef"].dump()), ", not a number"),
                  "fix config.json");
    c.aux_coef = j["router_aux_loss_coef"].get<double>();
  }
  if (j.contains("sliding_window") && !j["sliding_window"].is_null())
    throw Error(at,
                cat("has sliding_window ", brief(j["sliding_window"].dump()),
                    "; weft's Mixtral attends causally "
                    "over the whole sequence"),
                "use a model without a sliding window (null)");
  if (j.contains("router_jitter_noise") && !(j["router_jitter_noise"].is_number() && j["router_jitter_noise"] == 0))
    throw Error(at, cat("has router_jitter_noise ", brief(j["router_jitter_noise"].dump()), "; weft's router is exact"),
                "use 0");
  // The experts' count against a bound before the table of names is built (E tensors a layer each).
  if (c.experts < 1 || c.experts > (1 << 20) || c.top_k < 1 || c.top_k > c.experts)
    throw Error(at, cat("has ", c.experts, " experts, ", c.top_k, " a token"),
                "pass a config.json with 1 to 2^20 experts and num_experts_per_tok from 1 to them");
  return c;
}

// Refuses, naming what it has, a router that transformers' MixtralForCausalLM and
// Qwen3MoeForCausalLM cannot hold (sigmoid scores, a scale, an expert bias: Config).
inline void check_hf_router(const Config& c, const std::string& where) {
  if (c.softmax_router()) return;
  throw Error(where,
              cat("the model's router takes ", c.score == nn::Score::sigmoid ? "sigmoid" : "softmax", " scores",
                  c.scale != 1 ? cat(" scaled by ", c.scale) : "", c.expert_bias ? " with an expert bias" : "",
                  c.groups != 1 ? cat(" from ", c.top_groups, " of ", c.groups, " expert groups") : ""),
              "transformers' Mixtral and Qwen3-MoE routers are softmax, unscaled, without a bias or groups: exchange "
              "directories with runs that leave out --router sigmoid, --expert-bias and --expert-groups");
}

// transformers' config.json for c.
inline nlohmann::json hf_config(const Config& c) {
  nlohmann::json j = llama::hf_config(c);
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  j.erase("attention_bias");
  j.erase("mlp_bias");
  j["num_local_experts"] = c.experts;
  j["num_experts_per_tok"] = c.top_k;
  j["router_aux_loss_coef"] = c.aux_coef;
  j["output_router_logits"] = false;
  j["router_jitter_noise"] = 0.0;
  j["sliding_window"] = nullptr;
  return j;
}

// The configuration a checkpoint's manifest records (mixtral::record).
inline Config config_of(const checkpoint::Manifest& m) {
  Config c;
  static_cast<llama::Config&>(c) = llama::config_of(m);
  const auto field = [&](const char* k) {
    const auto it = m.model.find(k);
    if (it == m.model.end() || !it->is_number_integer())
      throw Error("mixtral", cat("the checkpoint's manifest records no integer ", k, " for its model"),
                  "export a checkpoint saved from mixtral::Model");
    return it->get<std::int64_t>();
  };
  c.experts = field("experts");
  c.top_k = field("top_k");
  c.aux_coef = static_cast<double>(field("aux_coef_x1e9")) / 1e9;
  c.z_coef = static_cast<double>(field("z_coef_x1e9")) / 1e9;
  c.capacity_factor = static_cast<double>(field("capacity_factor_x1e6")) / 1e6;
  // The router past transformers' (recorded only where set: mixtral::record).
  const auto optional = [&](const char* k) { return m.model.contains(k) ? field(k) : std::int64_t{-1}; };
  if (optional("router_sigmoid") == 1) c.score = nn::Score::sigmoid;
  if (const auto v = optional("router_scale_x1e6"); v >= 0) c.scale = static_cast<double>(v) / 1e6;
  if (optional("expert_bias") == 1) c.expert_bias = true;
  if (const auto g = optional("router_groups"); g >= 1) c.groups = g, c.top_groups = field("router_top_groups");
  validate(c, {}, false, 1);
  return c;
}

inline Config hf_config_of(const std::string& dir, const Config& base = {}) {
  const auto f = llama::hf_detail::read_config(dir, "mixtral::import");
  return config_from_hf(f.json, f.at, base);
}

// The experts config.json counts against the router's tensors in the directory (their headers
// only): a config.json whose num_local_experts disagrees with the weights is refused by name before
// a run is configured from it, not when its weights are converted.
inline void check_experts(const std::string& dir, const Config& c) {
  hf_detail::check_experts(dir, "mixtral::import", hf_detail::mixtral_names, c.layers, c.experts,
                           [](std::int64_t) { return true; });
}

// Reads a transformers Mixtral directory (as llama::import_hf reads Llama's) and writes its weights
// as a weft checkpoint of step 0 at `out`; returns the configuration, seq and seed from `base`.
inline Config import_hf(const std::string& dir, const std::string& out, const Config& base = {}) {
  const Config c = hf_config_of(dir, base);
  const checkpoint::ImportDir files(dir, "model", cat("mixtral::import(", dir, ")"));
  const double per_layer = 7 + 3.0 * static_cast<double>(c.experts);  // attention and norms 6, the router, 3 E
  if (static_cast<double>(c.layers) * per_layer > static_cast<double>(files.names().size()))
    throw Error(files.at(),
                cat("holds ", files.names().size(), " tensors, too few for config.json's ", c.layers, " layers of ",
                    c.experts, " experts"),
                "pass a config.json that matches the weights");
  llama::hf_detail::import_tensors(files, hf_detail::names(c), record(c), c.seed, dir, out,
                                   cat("a Mixtral of ", c.layers, " layers of ", c.experts, " experts"),
                                   "MixtralForCausalLM");
  return c;
}

// Writes the checkpoint at `checkpoint` (any mesh, expert degree, strategy, precision) as a
// transformers Mixtral directory at `out` (as llama::export_hf writes Llama's).
inline void export_hf(const std::string& checkpoint, const std::string& out, DType dtype = DType::f32,
                      std::uint64_t max_shard_bytes = 5'000'000'000) {
  const checkpoint::Reader r(checkpoint);
  const Config c = config_of(r.manifest());
  check_hf_router(c, "mixtral::export");
  llama::hf_detail::export_tensors(r, hf_detail::names(c), checkpoint, out, dtype, max_shard_bytes, hf_config(c),
                                   "mixtral");
}

}  // namespace weft::mixtral
