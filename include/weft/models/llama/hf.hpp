// Hugging Face Llama (transformers' LlamaForCausalLM) in and out: import a model directory as a
// weft checkpoint of its weights, export a weft checkpoint as such a directory.
//
//   weft (model.hpp)                       Hugging Face
//   wte (V, C)                             model.embed_tokens.weight
//   layers.<l>.attn_norm.weight (C)        model.layers.<l>.input_layernorm.weight
//   layers.<l>.attn.qkv.weight             model.layers.<l>.self_attn.{q,k,v}_proj.weight, (H hd, C),
//     (KV (g + 2) hd, C), rows                (KV hd, C), (KV hd, C): rows of head h of q go to group
//     (group, {q_0 .. q_{g-1}, k, v}, hd)     h / g, slot h % g; rows of kv head j to group j
//   layers.<l>.attn.proj.weight (C, C)     model.layers.<l>.self_attn.o_proj.weight
//   layers.<l>.mlp_norm.weight (C)         model.layers.<l>.post_attention_layernorm.weight
//   layers.<l>.gate_up.weight (2F, C),     model.layers.<l>.mlp.{gate,up}_proj.weight (F, C) each:
//     rows (F, {gate, up})                    gate row f is weft's row 2f, up row f is 2f + 1
//   layers.<l>.down.weight (C, F)          model.layers.<l>.mlp.down_proj.weight
//   ln_f.weight (C)                        model.norm.weight
//   lm_head (V, C)                         lm_head.weight (absent where tie_word_embeddings)
//
// weft's rotary embedding is transformers' (rotate_half over the two halves of each head), so q and
// k rows keep their order within a head. config.json gives the sizes, rms_norm_eps and the rotary
// parameters, under "rope_parameters" (transformers 5) or "rope_theta" and "rope_scaling" (4.x).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/checkpoint/checkpoint.hpp"
#include "weft/checkpoint/export_dir.hpp"
#include "weft/checkpoint/import_dir.hpp"
#include "weft/core/files.hpp"
#include "weft/core/json_limits.hpp"
#include "weft/models/llama/config.hpp"

namespace weft::llama {

namespace hf_detail {

inline nlohmann::json read_json(const std::string& path, const std::string& at) {
  const std::string text = read_text_file(path, 1 << 24, at);
  check_json_limits(text, {.max_bytes = 1 << 24, .max_depth = 16}, at);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(at, cat("is not valid JSON (", brief(e.what(), 200), ")"), "pass transformers' files");
  }
}

// One weft tensor and the Hugging Face tensors it is made of, with their shapes. A weft tensor is
// read as rows of its last dimension; each row comes from one row of one part:
//   plain      one part, the same rows
//   qkv        the attention's q, k, v (hd the head size, g the query heads a key-value head):
//              weft's rows (group, {q_0 .. q_{g-1}, k, v}, hd)
//   gate_up    gate and up, interleaved: weft's row 2f is gate row f, 2f + 1 up row f
//   expert_gate_up   2E parts (gate_0, up_0, gate_1, up_1, ...): expert e's 2H rows interleave
//              its gate's and up's (a mixture of experts' (E, 2H, C))
//   expert_stack     E parts of equal rows, stacked (a mixture of experts' (E, C, H))
struct Named {
  std::string weft;
  std::vector<std::string> hf;
  enum class Kind { plain, qkv, gate_up, expert_gate_up, expert_stack } kind = Kind::plain;
  std::vector<std::int64_t> shape;               // weft's
  std::vector<std::vector<std::int64_t>> parts;  // each Hugging Face tensor's
  std::int64_t hd = 0, g = 0;                    // qkv: the head size and the query heads a group

  std::int64_t cols() const { return shape.size() >= 2 ? shape.back() : 1; }
  std::int64_t rows() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n / cols();
  }
};

inline Named plain(std::string weft, std::string hf, std::vector<std::int64_t> shape) {
  return {std::move(weft), {std::move(hf)}, Named::Kind::plain, shape, {shape}};
}

// The attention's and the norms' tensors of layer l (weft's names under `w`, Hugging Face's under `h`):
// heads of hd (0: width / heads), and with qk_norm the heads' query and key norms (Qwen3's).
inline void attention_names(std::vector<Named>& n, const Config& c, const std::string& w, const std::string& h,
                            std::int64_t hd = 0, bool qk_norm = false) {
  const std::int64_t C = c.width, g = c.heads / c.kv_heads;
  if (hd <= 0) hd = c.head_dim();
  n.push_back(plain(w + "attn_norm.weight", h + "input_layernorm.weight", {C}));
  n.push_back({w + "attn.qkv.weight",
               {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"},
               Named::Kind::qkv,
               {c.kv_heads * (g + 2) * hd, C},
               {{c.heads * hd, C}, {c.kv_heads * hd, C}, {c.kv_heads * hd, C}},
               hd,
               g});
  if (qk_norm) {
    n.push_back(plain(w + "attn.q_norm.weight", h + "self_attn.q_norm.weight", {hd}));
    n.push_back(plain(w + "attn.k_norm.weight", h + "self_attn.k_norm.weight", {hd}));
  }
  n.push_back(plain(w + "attn.proj.weight", h + "self_attn.o_proj.weight", {C, c.heads * hd}));
  n.push_back(plain(w + "mlp_norm.weight", h + "post_attention_layernorm.weight", {C}));
}

// Every tensor of the model: `mlp(n, l, w, h)` appends layer l's MLP (Llama's SwiGLU by default);
// the attention's heads of hd, QK-normalised where qk_norm (attention_names).
template <class Mlp>
std::vector<Named> names_with(const Config& c, Mlp&& mlp, std::int64_t hd = 0, bool qk_norm = false) {
  const std::int64_t C = c.width;
  std::vector<Named> n{plain("wte", "model.embed_tokens.weight", {c.vocab, C})};
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string w = cat("layers.", l, "."), h = cat("model.layers.", l, ".");
    attention_names(n, c, w, h, hd, qk_norm);
    mlp(n, l, w, h);
  }
  n.push_back(plain("ln_f.weight", "model.norm.weight", {C}));
  if (!c.tied) n.push_back(plain("lm_head", "lm_head.weight", {c.vocab, C}));
  return n;
}

inline std::vector<Named> names(const Config& c) {
  const std::int64_t C = c.width, F = c.hidden;
  return names_with(c, [&](std::vector<Named>& n, std::int64_t, const std::string& w, const std::string& h) {
    n.push_back({w + "gate_up.weight",
                 {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"},
                 Named::Kind::gate_up,
                 {2 * F, C},
                 {{F, C}, {F, C}}});
    n.push_back(plain(w + "down.weight", h + "mlp.down_proj.weight", {C, F}));
  });
}

// The shapes: weft's tensor, and each Hugging Face part.
inline const std::vector<std::int64_t>& weft_shape(const Named& n, const Config&) { return n.shape; }
inline const std::vector<std::vector<std::int64_t>>& hf_shapes(const Named& n, const Config&) { return n.parts; }

// Where row r of weft's tensor comes from: (part, row of that part).
inline std::pair<std::size_t, std::int64_t> source_row(const Named& n, std::int64_t r) {
  switch (n.kind) {
    case Named::Kind::gate_up: return {static_cast<std::size_t>(r % 2), r / 2};
    case Named::Kind::qkv: {
      const std::int64_t grp = r / ((n.g + 2) * n.hd), slot = (r / n.hd) % (n.g + 2), d = r % n.hd;
      if (slot < n.g) return {0, (grp * n.g + slot) * n.hd + d};
      return {slot == n.g ? 1u : 2u, grp * n.hd + d};
    }
    case Named::Kind::expert_gate_up: {
      const std::int64_t per = n.rows() / static_cast<std::int64_t>(n.parts.size() / 2);  // 2H rows an expert
      const std::int64_t e = r / per, i = r % per;
      return {static_cast<std::size_t>(2 * e + i % 2), i / 2};
    }
    case Named::Kind::expert_stack: {
      const std::int64_t per = n.rows() / static_cast<std::int64_t>(n.parts.size());
      return {static_cast<std::size_t>(r / per), r % per};
    }
    case Named::Kind::plain: break;
  }
  return {0, r};
}
inline std::pair<std::size_t, std::int64_t> source_row(const Named& n, const Config&, std::int64_t r) {
  return source_row(n, r);
}

}  // namespace hf_detail

// The configuration a transformers config.json describes; seq (the length to train on) and seed are
// the caller's (config.json's max_position_embeddings bounds the positions the model was trained
// for, not the length of a run).
// `model_type` and `architecture`: the model_type it must have and the class that reads it (a family built
// on Llama's blocks reads its config.json here first: models/mixtral/hf.hpp).
inline Config config_from_hf(const nlohmann::json& j, const std::string& at, Config base = {},
                             std::string_view model_type = "llama",
                             std::string_view architecture = "LlamaForCausalLM") {
  if (!j.is_object()) throw Error(at, "is not a JSON object", "pass transformers' config.json");
  auto integer = [&](const char* k, std::optional<std::int64_t> dflt = {}) -> std::int64_t {
    if (!j.contains(k) || j[k].is_null()) {
      if (dflt) return *dflt;
      throw Error(at, cat("has no ", k), cat("pass a ", architecture, " config.json"));
    }
    if (!j[k].is_number_integer())
      throw Error(at, cat("has ", k, " ", brief(j[k].dump()), ", not an integer"), "fix config.json");
    // An unsigned number past int64 (JSON holds it as one) would wrap on conversion.
    if (j[k].is_number_unsigned() &&
        j[k].get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw Error(at, cat("has ", k, " ", j[k].dump(), ", past the largest 64-bit integer"), "fix config.json");
    return j[k].get<std::int64_t>();
  };
  auto real = [&](const nlohmann::json& o, const char* k, std::optional<double> dflt = {}) -> double {
    if (!o.contains(k) || o[k].is_null()) {
      if (dflt) return *dflt;
      throw Error(at, cat("has no ", k), cat("pass a ", architecture, " config.json"));
    }
    if (!o[k].is_number())
      throw Error(at, cat("has ", k, " ", brief(o[k].dump()), ", not a number"), "fix config.json");
    return o[k].get<double>();
  };
  if (j.contains("model_type") && j["model_type"] != model_type)
    throw Error(at, cat("describes a model of type ", brief(j["model_type"].dump())),
                cat("pass a ", architecture, " (model_type \"", model_type, "\")"));
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    throw Error(at, cat("has hidden_act ", brief(j["hidden_act"].dump()), "; weft's Llama MLP is SwiGLU"),
                "use \"silu\"");
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (j.contains(k) && j[k] == true)
      throw Error(at, cat("has ", k, " true; weft's Llama has no biases"), "use a model without biases");
  Config c = base;
  c.vocab = integer("vocab_size");
  c.width = integer("hidden_size");
  c.hidden = integer("intermediate_size");
  c.layers = integer("num_hidden_layers");
  c.heads = integer("num_attention_heads");
  c.kv_heads = integer("num_key_value_heads", c.heads);
  if (c.heads >= 1 && integer("head_dim", c.width / c.heads) != c.width / c.heads)
    throw Error(at, cat("has head_dim ", integer("head_dim"), " for width ", c.width, " over ", c.heads, " heads"),
                "use a model whose head size is hidden_size / num_attention_heads");
  c.norm_eps = real(j, "rms_norm_eps", 1e-6);
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_boolean() &&
      !j["tie_word_embeddings"].is_null())
    throw Error(at, cat("has tie_word_embeddings ", brief(j["tie_word_embeddings"].dump()), ", not true or false"),
                "fix config.json");
  c.tied = j.contains("tie_word_embeddings") && j["tie_word_embeddings"] == true;
  // transformers 5: rope_parameters {rope_type, rope_theta, ...}; 4.x: rope_theta, rope_scaling
  // (null where there is none). Anything else there (a string, a number) is refused: read as no
  // scaling, the model would train unscaled.
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (j.contains(k) && !j[k].is_object() && !j[k].is_null())
      throw Error(at, cat("has ", k, " ", brief(j[k].dump()), ", not an object"), "fix config.json");
  const nlohmann::json* rope = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rope = &j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rope = &j["rope_scaling"];
  c.rope = {};
  c.rope.theta = rope && rope->contains("rope_theta") ? real(*rope, "rope_theta") : real(j, "rope_theta", 10000.0);
  std::string type = "default";
  if (rope) {
    const char* key = rope->contains("rope_type") ? "rope_type" : "type";
    if (rope->contains(key)) {
      if (!(*rope)[key].is_string())
        throw Error(at, cat("has ", key, " ", brief((*rope)[key].dump())), "fix config.json");
      type = (*rope)[key].get<std::string>();
    }
  }
  if (type == "llama3") {
    c.rope.factor = real(*rope, "factor");
    c.rope.low_freq_factor = real(*rope, "low_freq_factor");
    c.rope.high_freq_factor = real(*rope, "high_freq_factor");
    c.rope.original_max_positions = real(*rope, "original_max_position_embeddings");
  } else if (type != "default") {
    throw Error(at, cat("has the rotary scaling \"", brief(type), "\""),
                "use a model with no scaling or the \"llama3\" scaling");
  }
  validate(c, {}, false, 1);
  return c;
}

// transformers' config.json for c (both the 5.x and the 4.x keys for the rotary parameters).
// max_position_embeddings: the sequence trained on, or with the llama3 scaling the original context
// times the factor (the context the scaling extends to), whichever is longer.
inline nlohmann::json hf_config(const Config& c) {
  const auto max_positions = std::max<std::int64_t>(
      c.seq, c.rope.factor > 0 ? static_cast<std::int64_t>(c.rope.original_max_positions * c.rope.factor) : 0);
  nlohmann::json rope = {{"rope_type", c.rope.factor > 0 ? "llama3" : "default"}, {"rope_theta", c.rope.theta}};
  if (c.rope.factor > 0) {
    rope["factor"] = c.rope.factor;
    rope["low_freq_factor"] = c.rope.low_freq_factor;
    rope["high_freq_factor"] = c.rope.high_freq_factor;
    rope["original_max_position_embeddings"] = static_cast<std::int64_t>(c.rope.original_max_positions);
  }
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", c.vocab},
          {"hidden_size", c.width},
          {"intermediate_size", c.hidden},
          {"num_hidden_layers", c.layers},
          {"num_attention_heads", c.heads},
          {"num_key_value_heads", c.kv_heads},
          {"head_dim", c.head_dim()},
          {"hidden_act", "silu"},
          {"max_position_embeddings", max_positions},
          {"rms_norm_eps", c.norm_eps},
          {"rope_parameters", rope},
          {"tie_word_embeddings", c.tied},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"dtype", "float32"}};
}

// The configuration a checkpoint's manifest records (record() above), checked as a model's would be.
inline Config config_of(const checkpoint::Manifest& m) {
  auto field = [&](const char* k) {
    const auto it = m.model.find(k);
    if (it == m.model.end() || !it->is_number_integer())
      throw Error("llama", cat("the checkpoint's manifest records no integer ", k, " for its model"),
                  "export a checkpoint saved from llama::Model");
    return it->get<std::int64_t>();
  };
  Config c;
  c.vocab = field("vocab");
  c.seq = field("seq");
  c.layers = field("layers");
  c.heads = field("heads");
  c.kv_heads = field("kv_heads");
  c.width = field("width");
  c.hidden = field("hidden");
  c.tied = field("tied") != 0;
  c.rope.theta = static_cast<double>(field("rope_theta_x1e6")) / 1e6;
  c.rope.factor = static_cast<double>(field("rope_factor_x1e6")) / 1e6;
  c.rope.low_freq_factor = static_cast<double>(field("rope_low_freq_factor_x1e6")) / 1e6;
  c.rope.high_freq_factor = static_cast<double>(field("rope_high_freq_factor_x1e6")) / 1e6;
  c.rope.original_max_positions = static_cast<double>(field("rope_original_max_positions"));
  c.norm_eps = static_cast<double>(field("norm_eps_x1e12")) / 1e12;
  validate(c, {}, false, 1);
  return c;
}

// Reads a transformers Llama directory (config.json and model.safetensors, or the sharded form with
// model.safetensors.index.json; F64, F32 or BF16) and writes its weights as a weft checkpoint of
// step 0 (consolidated, f64: every source dtype exactly) at `out`; returns the configuration, with
// seq and seed from `base`. Load it with checkpoint::load(out, model, dp, mesh, {.optimizer =
// false}): each rank reads only its own shards. A missing or extra tensor, a shape that disagrees
// with config.json, or a dtype weft cannot read is refused by name, before anything is written. The
// weights are streamed: one tensor is in memory at a time, never the model.
// The configuration a transformers directory's config.json describes (read and checked alone: a
// caller compares it with its run before anything is converted).
namespace hf_detail {
// A model directory's config.json, parsed, and where errors about it come from ("<who>(<path>)");
// refused by name where the directory has none.
struct ConfigFile {
  nlohmann::json json;
  std::string at;
};
inline ConfigFile read_config(const std::string& dir, const std::string& who) {
  const auto path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::is_regular_file(path))
    throw Error(cat(who, "(", dir, ")"), "has no config.json",
                "pass a directory that transformers' save_pretrained wrote");
  const std::string at = cat(who, "(", path, ")");
  return {read_json(path, at), at};
}
}  // namespace hf_detail

inline Config hf_config_of(const std::string& dir, const Config& base = {}) {
  const auto f = hf_detail::read_config(dir, "llama::import");
  return config_from_hf(f.json, f.at, base);
}

namespace hf_detail {

// The tensors of `names` read from `files` (a model directory), every part's presence, shape and
// dtype checked and every tensor the table does not name refused (`model`: what the table
// describes, "a Llama of 2 layers"), before anything is written; then written as a weft checkpoint
// at `out` with the record of its configuration. One tensor is in memory at a time.
inline void import_tensors(const checkpoint::ImportDir& files, const std::vector<Named>& names,
                           const std::vector<std::pair<std::string, std::int64_t>>& record, std::uint64_t seed,
                           const std::string& dir, const std::string& out, const std::string& model,
                           const std::string& architecture) {
  using namespace weft::checkpoint;
  std::set<std::string> known;
  for (const auto& n : names) {
    for (std::size_t p = 0; p < n.hf.size(); ++p) {
      known.insert(n.hf[p]);
      const TensorInfo* t = files.find(n.hf[p]);
      if (!t)
        throw Error(files.at(), cat("has no tensor ", n.hf[p]), "pass the whole model that config.json describes");
      if (t->shape != n.parts[p])
        throw Error(
            files.at(),
            cat(n.hf[p], " has the shape ", join(t->shape, "x"), "; config.json's sizes give ", join(n.parts[p], "x")),
            "pass a config.json that matches the weights");
      if (t->dtype != DType::f32 && t->dtype != DType::bf16 && t->dtype != DType::f64)
        throw Error(files.at(), cat(n.hf[p], " has dtype ", safetensors_dtype(t->dtype)),
                    "convert it to F32, BF16 or F64");
    }
  }
  for (const auto& name : files.names())
    if (!known.contains(name) && !name.ends_with("rotary_emb.inv_freq"))
      throw Error(files.at(), cat("has a tensor ", brief(name), " that ", model, " does not have"),
                  cat("pass a ", architecture, " whose config.json describes every tensor"));
  std::vector<ImportedTensor> tensors;
  for (const auto& n : names)
    tensors.push_back({n.weft, n.shape, [&n, &files](std::vector<double>& w) {
                         std::vector<std::vector<double>> parts;
                         for (const auto& h : n.hf) parts.push_back(files.read(h));
                         const std::int64_t cols = n.cols();
                         for (std::int64_t r = 0; r < n.rows(); ++r) {
                           const auto [p, src] = source_row(n, r);
                           std::copy_n(parts[p].begin() + src * cols, cols, w.begin() + r * cols);
                         }
                       }});
  write_imported(out, tensors, record, seed, dir, files.at());
}

}  // namespace hf_detail

inline Config import_hf(const std::string& dir, const std::string& out, const Config& base = {}) {
  const Config c = hf_config_of(dir, base);
  const checkpoint::ImportDir files(dir, "model", cat("llama::import(", dir, ")"));
  // config.json's layers against what the files can hold (each layer has 9 tensors), before the
  // table of names (about 1.6 KB a layer) is built: 10^7 layers in a config.json ran out of memory.
  if (static_cast<double>(c.layers) * 9 > static_cast<double>(files.names().size()))
    throw Error(
        files.at(),
        cat("holds ", files.names().size(), " tensors, too few for config.json's ", c.layers, " layers of 9 each"),
        "pass a config.json that matches the weights");
  hf_detail::import_tensors(files, hf_detail::names(c), record(c), c.seed, dir, out,
                            cat("a Llama of ", c.layers, " layers", c.tied ? " with a tied head" : ""),
                            "LlamaForCausalLM");
  return c;
}

// Writes the parameters of the checkpoint at `checkpoint` (any mesh, strategy, precision) as a
// transformers Llama directory at `out`, loadable by LlamaForCausalLM.from_pretrained: config.json,
// and the weights in `dtype` (F32, or F64 for an exact round trip) as save_pretrained writes them:
// up to max_shard_bytes of them in model.safetensors; more split, in order, into files
// model-0000k-of-0000n.safetensors of at most max_shard_bytes each (a larger tensor alone in its
// file), with model.safetensors.index.json naming each tensor's file. The weights are streamed: one
// weft tensor is in memory at a time (in double), never the model. Files of either form left in
// `out` by an earlier export are replaced.
namespace hf_detail {

// The tensors of `names` from the checkpoint `r` (at `checkpoint`) as a transformers directory at
// `out` with `config` as its config.json (export_hf below says how; `who`: the model that saves
// such checkpoints, for errors).
inline void export_tensors(const checkpoint::Reader& r, const std::vector<Named>& names, const std::string& checkpoint,
                           const std::string& out, DType dtype, std::uint64_t max_shard_bytes, nlohmann::json config,
                           const std::string& who) {
  using namespace weft::checkpoint;
  const std::string at = cat(who, "::export(", checkpoint, ")");
  if (dtype != DType::f32 && dtype != DType::f64)
    throw Error(cat(who, "::export"), cat("cannot write dtype ", safetensors_dtype(dtype)), "use F32 or F64");
  if (max_shard_bytes == 0) throw Error(cat(who, "::export"), "a largest file of 0 bytes", "pass max_shard_bytes > 0");
  // Every Hugging Face tensor in order: which weft tensor and part it comes from. Shapes are
  // checked for the whole model before anything is written.
  struct Piece {
    std::size_t weft, part;
    TensorData t;
    std::uint64_t bytes;
  };
  std::vector<Piece> pieces;
  std::vector<std::string> sources;
  std::uint64_t total = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    const auto& n = names[k];
    sources.push_back(r.has("master/" + n.weft) ? "master/" + n.weft : "param/" + n.weft);
    const auto& shape = n.shape;
    const auto rshape = r.shape(sources.back());
    if (rshape != shape)
      throw Error(at,
                  cat(sources.back(), " has the shape ", join(rshape, "x"), "; its record gives ", join(shape, "x")),
                  cat("export a checkpoint saved by ", who, "::Model"));
    const auto& shapes = n.parts;
    for (std::size_t p = 0; p < shapes.size(); ++p) {
      std::uint64_t bytes = size_of(dtype);
      for (std::int64_t d : shapes[p]) bytes *= static_cast<std::uint64_t>(d);
      pieces.push_back({k, p, {n.hf[p], dtype, shapes[p], nullptr}, bytes});
      total += bytes;
    }
  }
  // The files: pieces in order, a new file where the next piece would pass max_shard_bytes.
  std::vector<std::vector<std::size_t>> files;
  std::uint64_t filled = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (files.empty() || (filled > 0 && filled + pieces[i].bytes > max_shard_bytes)) {
      files.emplace_back();
      filled = 0;
    }
    files.back().push_back(i);
    filled += pieces[i].bytes;
  }
  // A piece's bytes: the rows of its weft tensor (read once for all its parts) that it holds.
  std::size_t loaded = names.size();
  std::vector<double> w;
  std::vector<std::byte> buf;
  auto bytes_of = [&](const Piece& pc) {
    if (pc.weft != loaded) {
      w = r.read<double>(sources[pc.weft]);
      loaded = pc.weft;
    }
    const auto& n = names[pc.weft];
    const std::int64_t cols = n.cols();
    buf.resize(static_cast<std::size_t>(pc.bytes));
    for (std::int64_t row = 0; row < n.rows(); ++row) {
      const auto [p, dst] = source_row(n, row);
      if (p != pc.part) continue;
      const double* from = w.data() + row * cols;
      if (dtype == DType::f64) {
        std::memcpy(buf.data() + dst * cols * 8, from, static_cast<std::size_t>(cols) * 8);
      } else {
        for (std::int64_t j = 0; j < cols; ++j) {
          const float v = static_cast<float>(from[j]);
          std::memcpy(buf.data() + (dst * cols + j) * 4, &v, 4);
        }
      }
    }
    return std::span<const std::byte>(buf);
  };
  // Into checkpoint::ExportDir: never into the checkpoint, never over a file an earlier export did
  // not write, each file through a .tmp and a rename; an earlier export's shards that this one does
  // not write again go at the end.
  ExportDir dir(out, checkpoint);
  auto write_file = [&](const std::string& name, const std::vector<std::size_t>& which) {
    std::vector<TensorData> ts;
    for (std::size_t i : which) ts.push_back(pieces[i].t);
    dir.write(name, [&](const std::string& tmp) {
      write_streamed(tmp, std::span<const TensorData>(ts), {{"format", "pt"}},
                     [&](std::size_t i, std::uint64_t) { return bytes_of(pieces[which[i]]); });
    });
  };
  if (files.size() == 1) {
    write_file("model.safetensors", files[0]);
  } else {
    nlohmann::json map = nlohmann::json::object();
    for (std::size_t f = 0; f < files.size(); ++f) {
      const auto five = [](std::size_t k) {  // at least five digits, as save_pretrained writes them
        const std::string d = std::to_string(k);
        return std::string(d.size() < 5 ? 5 - d.size() : 0, '0') + d;
      };
      const std::string name = cat("model-", five(f + 1), "-of-", five(files.size()), ".safetensors");
      write_file(name, files[f]);
      for (std::size_t i : files[f]) map[pieces[i].t.name] = name;
    }
    dir.write_text("model.safetensors.index.json",
                   nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) + "\n");
  }
  config["dtype"] = dtype == DType::f64 ? "float64" : "float32";
  dir.write_text("config.json", config.dump(2) + "\n");
  dir.commit();
}

}  // namespace hf_detail

inline void export_hf(const std::string& checkpoint, const std::string& out, DType dtype = DType::f32,
                      std::uint64_t max_shard_bytes = 5'000'000'000) {
  const checkpoint::Reader r(checkpoint);
  const Config c = config_of(r.manifest());
  hf_detail::export_tensors(r, hf_detail::names(c), checkpoint, out, dtype, max_shard_bytes, hf_config(c), "llama");
}

}  // namespace weft::llama
