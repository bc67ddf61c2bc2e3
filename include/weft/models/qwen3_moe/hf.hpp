// Hugging Face Qwen3-MoE (transformers' Qwen3MoeForCausalLM) in and out: import a model directory
// as a weft checkpoint of its weights, export a weft checkpoint as such a directory. Llama's tensors
// as models/llama/hf.hpp maps them (heads of head_dim), Qwen3's QK norms, and each sparse layer's
// mixture of experts as save_pretrained writes it (as Mixtral's, models/mixtral/hf.hpp, under other
// names), each dense layer's MLP as Llama's under "mlp.":
//
//   weft (model.hpp)                          Hugging Face
//   layers.<l>.attn.q_norm.weight (hd)        model.layers.<l>.self_attn.q_norm.weight
//   layers.<l>.attn.k_norm.weight (hd)        model.layers.<l>.self_attn.k_norm.weight
//   layers.<l>.attn.proj.weight (C, H hd)     model.layers.<l>.self_attn.o_proj.weight
//   layers.<l>.mlp.router.weight (E, C)       model.layers.<l>.mlp.gate.weight
//   layers.<l>.mlp.experts.gate_up            model.layers.<l>.mlp.experts.<e>.{gate,up}_proj.weight
//   layers.<l>.mlp.experts.down               model.layers.<l>.mlp.experts.<e>.down_proj.weight
//   layers.<l>.mlp.gate_up.weight (2Fd, C)    model.layers.<l>.mlp.{gate,up}_proj.weight (a dense layer)
//   layers.<l>.mlp.down.weight (C, Fd)        model.layers.<l>.mlp.down_proj.weight
//
// config.json: Llama's fields under model_type "qwen3_moe" with head_dim its own, and num_experts
// (num_local_experts as transformers 5 writes it), num_experts_per_tok, moe_intermediate_size (each
// expert's width: weft's hidden), norm_topk_prob, router_aux_loss_coef (0.001 where absent),
// decoder_sparse_step and mlp_only_layers (which layers are dense) and intermediate_size (their MLP's
// width). The export writes the dense layers as mlp_only_layers with a step of 1. Refused by name: a
// sliding window, an expert count that disagrees with the router's tensors, mlp_only_layers that is
// not a list of the layers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "weft/models/mixtral/hf.hpp"
#include "weft/models/qwen3_moe/model.hpp"

namespace weft::qwen3_moe {

namespace hf_detail {
using llama::hf_detail::Named;
inline const mixtral::hf_detail::MoeNames qwen3_names{"mlp.", "gate_proj", "up_proj", "down_proj",
                                                      "expert count (num_experts)"};

inline std::vector<Named> names(const Config& c) {
  const std::int64_t C = c.width, F = c.dense_width();
  return llama::hf_detail::names_with(
      c,
      [&](std::vector<Named>& n, std::int64_t l, const std::string& w, const std::string& h) {
        if (c.sparse(l)) return mixtral::hf_detail::moe_names(n, w, h, qwen3_names, c.experts, c.width, c.hidden);
        n.push_back({w + "mlp.gate_up.weight",
                     {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"},
                     Named::Kind::gate_up,
                     {2 * F, C},
                     {{F, C}, {F, C}}});
        n.push_back(llama::hf_detail::plain(w + "mlp.down.weight", h + "mlp.down_proj.weight", {C, F}));
      },
      c.head_dim(), true);
}
}  // namespace hf_detail

// The configuration a transformers config.json describes (seq and seed the caller's).
inline Config config_from_hf(const nlohmann::json& j, const std::string& at, const Config& base = {}) {
  if (!j.is_object()) throw Error(at, "is not a JSON object", "pass transformers' config.json");
  const auto integer = [&](const char* k, std::optional<std::int64_t> dflt = {}) -> std::int64_t {
    if (!j.contains(k) || j[k].is_null()) {
      if (dflt) return *dflt;
      throw Error(at, cat("has no ", k), "pass a Qwen3MoeForCausalLM config.json");
    }
    if (!j[k].is_number_integer())
      throw Error(at, cat("has ", k, " ", brief(j[k].dump()), ", not an integer"), "fix config.json");
    return j[k].get<std::int64_t>();
  };
  // Llama's reader, without the head size (Qwen3's is its own).
  nlohmann::json llama_json = j;
  llama_json.erase("head_dim");
  Config c = base;
  static_cast<llama::Config&>(c) = llama::config_from_hf(llama_json, at, base, "qwen3_moe", "Qwen3MoeForCausalLM");
  c.head_size = integer("head_dim", c.width / std::max<std::int64_t>(c.heads, 1));
  c.hidden = integer("moe_intermediate_size");
  // num_experts on the Hub's models; transformers 5 writes it as num_local_experts (its attribute_map).
  c.experts = integer(j.contains("num_experts") ? "num_experts" : "num_local_experts");
  c.top_k = integer("num_experts_per_tok");
  c.norm_topk_prob = j.contains("norm_topk_prob") && j["norm_topk_prob"] == true;
  c.aux_coef = 0.001;
  if (j.contains("router_aux_loss_coef") && !j["router_aux_loss_coef"].is_null()) {
    if (!j["router_aux_loss_coef"].is_number())
      throw Error(at, cat("has router_aux_loss_coef ", brief(j["router_aux_loss_coef"].dump()), ", not a number"),
                  "fix config.json");
    c.aux_coef = j["router_aux_loss_coef"].get<double>();
  }
  // The dense layers: transformers' rule (qwen3_moe::Config::sparse), its width intermediate_size.
  c.sparse_step = integer("decoder_sparse_step", 1);
  c.mlp_only_layers.clear();
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const auto& m = j["mlp_only_layers"];
    if (!m.is_array() || m.size() > static_cast<std::size_t>(std::max<std::int64_t>(c.layers, 0)) ||
        !std::ranges::all_of(m, [](const nlohmann::json& v) { return v.is_number_integer(); }))
      throw Error(at, cat("has mlp_only_layers ", brief(m.dump()), ", not a list of its layers"), "fix config.json");
    for (const auto& v : m) c.mlp_only_layers.push_back(v.get<std::int64_t>());
  }
  c.dense_hidden = c.dense_layers().empty() ? 0 : integer("intermediate_size");
  if (j.contains("use_sliding_window") && j["use_sliding_window"] == true)
    throw Error(at, "has use_sliding_window true; weft's Qwen3-MoE attends causally over the whole sequence",
                "use a model without a sliding window");
  if (c.experts < 1 || c.experts > (1 << 20) || c.top_k < 1 || c.top_k > c.experts)
    throw Error(at, cat("has ", c.experts, " experts, ", c.top_k, " a token"),
                "pass a config.json with 1 to 2^20 experts and num_experts_per_tok from 1 to them");
  validate(c, {}, false, 1);
  return c;
}

// transformers' config.json for c.
inline nlohmann::json hf_config(const Config& c) {
  nlohmann::json j = llama::hf_config(c);
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["model_type"] = "qwen3_moe";
  j.erase("mlp_bias");
  j["head_dim"] = c.head_dim();
  const auto dense = c.dense_layers();
  j["intermediate_size"] = c.dense_width();  // the dense layers' MLP (with none, the experts')
  j["moe_intermediate_size"] = c.hidden;
  j["num_experts"] = c.experts;
  j["num_experts_per_tok"] = c.top_k;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = dense;
  j["router_aux_loss_coef"] = c.aux_coef;
  j["output_router_logits"] = false;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  return j;
}

// The configuration a checkpoint's manifest records (qwen3_moe::record).
inline Config config_of(const checkpoint::Manifest& m) {
  Config c;
  static_cast<mixtral::Config&>(c) = mixtral::config_of(m);
  const auto field = [&](const char* k) {
    const auto it = m.model.find(k);
    if (it == m.model.end() || !it->is_number_integer())
      throw Error("qwen3_moe", cat("the checkpoint's manifest records no integer ", k, " for its model"),
                  "export a checkpoint saved from qwen3_moe::Model");
    return it->get<std::int64_t>();
  };
  c.head_size = field("head_dim");
  c.norm_topk_prob = field("norm_topk_prob") != 0;
  if (m.model.contains("dense_layers")) {  // recorded where a layer is dense (qwen3_moe::record)
    const std::int64_t n = field("dense_layers");
    if (n < 0 || n > c.layers)
      throw Error("qwen3_moe", cat("the checkpoint's manifest records ", n, " dense layers of ", c.layers),
                  "export a checkpoint saved from qwen3_moe::Model");
    for (std::int64_t i = 0; i < n; ++i) c.mlp_only_layers.push_back(field(cat("dense_layer_", i).c_str()));
    c.dense_hidden = field("dense_hidden");
  }
  validate(c, {}, false, 1);
  return c;
}

inline Config hf_config_of(const std::string& dir, const Config& base = {}) {
  const auto f = llama::hf_detail::read_config(dir, "qwen3_moe::import");
  return config_from_hf(f.json, f.at, base);
}

// config.json's expert count against the router's tensors (mixtral::check_experts says why).
inline void check_experts(const std::string& dir, const Config& c) {
  mixtral::hf_detail::check_experts(dir, "qwen3_moe::import", hf_detail::qwen3_names, c.layers, c.experts,
                                    [&](std::int64_t l) { return c.sparse(l); });
}

// Reads a transformers Qwen3-MoE directory (as llama::import_hf reads Llama's) and writes its
// weights as a weft checkpoint of step 0 at `out`; returns the configuration, seq and seed from base.
inline Config import_hf(const std::string& dir, const std::string& out, const Config& base = {}) {
  const Config c = hf_config_of(dir, base);
  const checkpoint::ImportDir files(dir, "model", cat("qwen3_moe::import(", dir, ")"));
  // A sparse layer: attention, norms and QK norms 8, the router, 3 E; a dense one: 8 and its MLP's 3.
  const auto dense = static_cast<double>(c.dense_layers().size());
  const double tensors =
      (static_cast<double>(c.layers) - dense) * (9 + 3.0 * static_cast<double>(c.experts)) + dense * 11;
  if (tensors > static_cast<double>(files.names().size()))
    throw Error(files.at(),
                cat("holds ", files.names().size(), " tensors, too few for config.json's ", c.layers, " layers (",
                    c.dense_layers().size(), " dense) of ", c.experts, " experts"),
                "pass a config.json that matches the weights");
  llama::hf_detail::import_tensors(files, hf_detail::names(c), record(c), c.seed, dir, out,
                                   cat("a Qwen3-MoE of ", c.layers, " layers of ", c.experts, " experts"),
                                   "Qwen3MoeForCausalLM");
  return c;
}

// Writes the checkpoint at `checkpoint` (any mesh, expert degree, strategy, precision) as a
// transformers Qwen3-MoE directory at `out`.
inline void export_hf(const std::string& checkpoint, const std::string& out, DType dtype = DType::f32,
                      std::uint64_t max_shard_bytes = 5'000'000'000) {
  const checkpoint::Reader r(checkpoint);
  const Config c = config_of(r.manifest());
  mixtral::check_hf_router(c, "qwen3_moe::export");
  llama::hf_detail::export_tensors(r, hf_detail::names(c), checkpoint, out, dtype, max_shard_bytes, hf_config(c),
                                   "qwen3_moe");
}

}  // namespace weft::qwen3_moe
