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

// One weft tensor and the Hugging Face tensors it is made of.
struct Named {
  std::string weft;
  std::vector<std::string> hf;
  enum class Kind { plain, qkv, gate_up } kind = Kind::plain;
};

inline std::vector<Named> names(const Config& c) {
  std::vector<Named> n{{"wte", {"model.embed_tokens.weight"}}};
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string w = cat("layers.", l, "."), h = cat("model.layers.", l, ".");
    n.push_back({w + "attn_norm.weight", {h + "input_layernorm.weight"}});
    n.push_back({w + "attn.qkv.weight",
                 {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"},
                 Named::Kind::qkv});
    n.push_back({w + "attn.proj.weight", {h + "self_attn.o_proj.weight"}});
    n.push_back({w + "mlp_norm.weight", {h + "post_attention_layernorm.weight"}});
    n.push_back({w + "gate_up.weight", {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"}, Named::Kind::gate_up});
    n.push_back({w + "down.weight", {h + "mlp.down_proj.weight"}});
  }
  n.push_back({"ln_f.weight", {"model.norm.weight"}});
  if (!c.tied) n.push_back({"lm_head", {"lm_head.weight"}});
  return n;
}

// The shapes: weft's tensor, and each Hugging Face part.
inline std::vector<std::int64_t> weft_shape(const Named& n, const Config& c) {
  const std::int64_t C = c.width, hd = c.head_dim(), g = c.heads / c.kv_heads;
  if (n.weft == "wte" || n.weft == "lm_head") return {c.vocab, C};
  if (n.kind == Named::Kind::qkv) return {c.kv_heads * (g + 2) * hd, C};
  if (n.kind == Named::Kind::gate_up) return {2 * c.hidden, C};
  if (n.weft.ends_with("attn.proj.weight")) return {C, C};
  if (n.weft.ends_with("down.weight")) return {C, c.hidden};
  return {C};
}
inline std::vector<std::vector<std::int64_t>> hf_shapes(const Named& n, const Config& c) {
  const std::int64_t C = c.width, hd = c.head_dim();
  if (n.kind == Named::Kind::qkv) return {{c.heads * hd, C}, {c.kv_heads * hd, C}, {c.kv_heads * hd, C}};
  if (n.kind == Named::Kind::gate_up) return {{c.hidden, C}, {c.hidden, C}};
  return {weft_shape(n, c)};
}

// Where row r of weft's tensor comes from: (part, row of that part).
inline std::pair<std::size_t, std::int64_t> source_row(const Named& n, const Config& c, std::int64_t r) {
  if (n.kind == Named::Kind::gate_up) return {static_cast<std::size_t>(r % 2), r / 2};
  if (n.kind == Named::Kind::qkv) {
    const std::int64_t hd = c.head_dim(), g = c.heads / c.kv_heads;
    const std::int64_t grp = r / ((g + 2) * hd), slot = (r / hd) % (g + 2), d = r % hd;
    if (slot < g) return {0, (grp * g + slot) * hd + d};
    return {slot == g ? 1u : 2u, grp * hd + d};
  }
  return {0, r};
}

}  // namespace hf_detail

// The configuration a transformers config.json describes; seq (the length to train on) and seed are
// the caller's (config.json's max_position_embeddings bounds the positions the model was trained
// for, not the length of a run).
inline Config config_from_hf(const nlohmann::json& j, const std::string& at, Config base = {}) {
  if (!j.is_object()) throw Error(at, "is not a JSON object", "pass transformers' config.json");
  auto integer = [&](const char* k, std::optional<std::int64_t> dflt = {}) -> std::int64_t {
    if (!j.contains(k) || j[k].is_null()) {
      if (dflt) return *dflt;
      throw Error(at, cat("has no ", k), "pass a LlamaForCausalLM config.json");
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
      throw Error(at, cat("has no ", k), "pass a LlamaForCausalLM config.json");
    }
    if (!o[k].is_number())
      throw Error(at, cat("has ", k, " ", brief(o[k].dump()), ", not a number"), "fix config.json");
    return o[k].get<double>();
  };
  if (j.contains("model_type") && j["model_type"] != "llama")
    throw Error(at, cat("describes a model of type ", brief(j["model_type"].dump())),
                "pass a Llama (model_type \"llama\")");
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
inline Config hf_config_of(const std::string& dir, const Config& base = {}) {
  const auto cfg_path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::is_regular_file(cfg_path))
    throw Error(cat("llama::import(", dir, ")"), "has no config.json",
                "pass a directory that transformers' save_pretrained wrote");
  return config_from_hf(hf_detail::read_json(cfg_path, cat("llama::import(", cfg_path, ")")),
                        cat("llama::import(", cfg_path, ")"), base);
}

inline Config import_hf(const std::string& dir, const std::string& out, const Config& base = {}) {
  using namespace weft::checkpoint;
  const Config c = hf_config_of(dir, base);
  const ImportDir files(dir, "model", cat("llama::import(", dir, ")"));
  // config.json's layers against what the files can hold (each layer has 9 tensors), before the
  // table of names (about 1.6 KB a layer) is built: 10^7 layers in a config.json ran out of memory.
  if (static_cast<double>(c.layers) * 9 > static_cast<double>(files.names().size()))
    throw Error(
        files.at(),
        cat("holds ", files.names().size(), " tensors, too few for config.json's ", c.layers, " layers of 9 each"),
        "pass a config.json that matches the weights");
  const auto names = hf_detail::names(c);
  std::set<std::string> known;
  for (const auto& n : names) {
    const auto shapes = hf_detail::hf_shapes(n, c);
    for (std::size_t p = 0; p < n.hf.size(); ++p) {
      known.insert(n.hf[p]);
      const TensorInfo* t = files.find(n.hf[p]);
      if (!t)
        throw Error(files.at(), cat("has no tensor ", n.hf[p]), "pass the whole model that config.json describes");
      if (t->shape != shapes[p])
        throw Error(
            files.at(),
            cat(n.hf[p], " has the shape ", join(t->shape, "x"), "; config.json's sizes give ", join(shapes[p], "x")),
            "pass a config.json that matches the weights");
      if (t->dtype != DType::f32 && t->dtype != DType::bf16 && t->dtype != DType::f64)
        throw Error(files.at(), cat(n.hf[p], " has dtype ", safetensors_dtype(t->dtype)),
                    "convert it to F32, BF16 or F64");
    }
  }
  for (const auto& name : files.names())
    if (!known.contains(name) && !name.ends_with("rotary_emb.inv_freq"))
      throw Error(files.at(),
                  cat("has a tensor ", brief(name), " that a Llama of ", c.layers, " layers",
                      c.tied ? " with a tied head" : "", " does not have"),
                  "pass a LlamaForCausalLM whose config.json describes every tensor");
  std::vector<ImportedTensor> tensors;
  for (const auto& n : names)
    tensors.push_back({n.weft, hf_detail::weft_shape(n, c), [&n, &c, &files](std::vector<double>& w) {
                         std::vector<std::vector<double>> parts;
                         for (const auto& h : n.hf) parts.push_back(files.read(h));
                         const auto shape = hf_detail::weft_shape(n, c);
                         const std::int64_t cols = shape.size() == 2 ? shape[1] : 1;
                         for (std::int64_t r = 0; r < shape[0]; ++r) {
                           const auto [p, src] = hf_detail::source_row(n, c, r);
                           std::copy_n(parts[p].begin() + src * cols, cols, w.begin() + r * cols);
                         }
                       }});
  write_imported(out, tensors, record(c), c.seed, dir, files.at());
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
inline void export_hf(const std::string& checkpoint, const std::string& out, DType dtype = DType::f32,
                      std::uint64_t max_shard_bytes = 5'000'000'000) {
  using namespace weft::checkpoint;
  const std::string at = cat("llama::export(", checkpoint, ")");
  if (dtype != DType::f32 && dtype != DType::f64)
    throw Error("llama::export", cat("cannot write dtype ", safetensors_dtype(dtype)), "use F32 or F64");
  if (max_shard_bytes == 0) throw Error("llama::export", "a largest file of 0 bytes", "pass max_shard_bytes > 0");
  const Reader r(checkpoint);
  const Config c = config_of(r.manifest());
  const auto names = hf_detail::names(c);
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
    const auto shape = hf_detail::weft_shape(n, c), rshape = r.shape(sources.back());
    if (rshape != shape)
      throw Error(at,
                  cat(sources.back(), " has the shape ", join(rshape, "x"), "; its record gives ", join(shape, "x")),
                  "export a checkpoint saved by llama::Model");
    const auto shapes = hf_detail::hf_shapes(n, c);
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
    const auto shape = hf_detail::weft_shape(n, c);
    const std::int64_t cols = shape.size() == 2 ? shape[1] : 1;
    buf.resize(static_cast<std::size_t>(pc.bytes));
    for (std::int64_t row = 0; row < shape[0]; ++row) {
      const auto [p, dst] = hf_detail::source_row(n, c, row);
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
  auto cfg = hf_config(c);
  cfg["dtype"] = dtype == DType::f64 ? "float64" : "float32";
  dir.write_text("config.json", cfg.dump(2) + "\n");
  dir.commit();
}

}  // namespace weft::llama
