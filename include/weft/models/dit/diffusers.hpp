// diffusers' DiTTransformer2DModel in: import a model directory (config.json and
// diffusion_pytorch_model.safetensors, or its sharded form) as a weft checkpoint of its weights.
//
//   weft (model.hpp)                         diffusers
//   patch.in_proj.weight (C, p p Cin)        pos_embed.proj.weight (C, Cin, p, p): columns permuted
//     columns (row, column, channel)           to weft's patch order (dit::patchify)
//   patch.in_proj.bias                       pos_embed.proj.bias
//   t_embedder.fc{1,2}.{weight,bias}         transformer_blocks.0.norm1.emb.timestep_embedder.linear_{1,2}
//   y_embedder.table (classes + 1, C)        transformer_blocks.0.norm1.emb.class_embedder.embedding_table
//   blocks.<l>.mod1 / gate1 / mod2 / gate2   transformer_blocks.<l>.norm1.linear (6C, C), rows
//     .{weight,bias}                           [0, 2C) / [2C, 3C) / [3C, 5C) / [5C, 6C)
//   blocks.<l>.attn.qkv (3 C, C), rows       transformer_blocks.<l>.attn1.to_{q,k,v}: row h hd + d of
//     (head, {q, k, v}, hd)                    each goes to (h, slot, d)
//   blocks.<l>.attn.proj                     transformer_blocks.<l>.attn1.to_out.0
//   blocks.<l>.mlp.fc / mlp.proj             transformer_blocks.<l>.ff.net.0.proj / ff.net.2
//   norm.mod.{weight,bias} (2C, C)           proj_out_1 (shift, then scale)
//   out_proj.{weight,bias} (p p Cin, C)      proj_out_2 (its features (row, column, channel): weft's)
//
// diffusers gives each block its own copy of the timestep and label embedders (the final layer
// reads block 0's); DiT has one, and diffusers' conversion of DiT's checkpoints copies it into
// every block: an import refuses copies that differ. Refused by name too: a config.json other than
// a DiT with adaLN-Zero, biased attention and GELU (tanh), a learned variance (out_channels twice
// the input's: weft's DiT predicts the noise alone), a missing, extra or misshapen tensor.
//
// defines: dit::diffusers_config, dit::diffusers_tensors, dit::import_diffusers
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "weft/checkpoint/import_dir.hpp"
#include "weft/core/files.hpp"
#include "weft/core/json_limits.hpp"
#include "weft/models/dit/config.hpp"

namespace weft::dit {

// The configuration a diffusers config.json describes; seed and init from `base`.
inline Config diffusers_config(const std::string& dir, Config base = {}) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string(), at = cat("dit::import(", path, ")");
  if (!std::filesystem::is_regular_file(path))
    throw Error(cat("dit::import(", dir, ")"), "has no config.json", "pass a directory that save_pretrained wrote");
  const std::string text = read_text_file(path, 1 << 20, at);
  check_json_limits(text, {.max_bytes = 1 << 20, .max_depth = 8}, at);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(at, cat("is not valid JSON (", brief(e.what(), 200), ")"), "pass diffusers' config.json");
  }
  auto str = [&](const char* k, const char* want) {
    if (!j.contains(k) || !j[k].is_string() || j[k].get<std::string>() != want)
      throw Error(at, cat("has ", k, " ", j.contains(k) ? brief(j[k].dump()) : "(absent)"),
                  cat("import a DiTTransformer2DModel with ", k, " \"", want, "\""));
  };
  auto num = [&](const char* k) {
    if (!j.contains(k) || !j[k].is_number_integer() || j[k].get<std::int64_t>() < 1)
      throw Error(at, cat("has ", k, " ", j.contains(k) ? brief(j[k].dump()) : "(absent)"),
                  cat("give ", k, " as a positive integer"));
    return j[k].get<std::int64_t>();
  };
  str("_class_name", "DiTTransformer2DModel");
  if (j.contains("norm_type")) str("norm_type", "ada_norm_zero");
  if (j.contains("activation_fn") && j["activation_fn"] != "gelu-approximate") str("activation_fn", "gelu-tanh");
  if (j.contains("attention_bias") && j["attention_bias"] != true)
    throw Error(at, "has attention_bias false", "import a DiT with biased attention (DiT's)");
  if (j.contains("norm_elementwise_affine") && j["norm_elementwise_affine"] != false)
    throw Error(at, "has norm_elementwise_affine true", "import a DiT whose norms have no parameters (DiT's)");
  Config c = base;
  c.in_channels = num("in_channels");
  if (j.contains("out_channels") && !j["out_channels"].is_null() &&
      (!j["out_channels"].is_number_integer() || j["out_channels"].get<std::int64_t>() != c.in_channels))
    throw Error(at, cat("has out_channels ", brief(j["out_channels"].dump()), " for ", c.in_channels, " in_channels"),
                "import a DiT that predicts the noise alone (out_channels null or in_channels); a learned variance "
                "(DiT's released checkpoints) is not in weft's DiT");
  c.sample = num("sample_size");
  c.patch = num("patch_size");
  c.layers = num("num_layers");
  c.heads = num("num_attention_heads");
  c.width = c.heads * num("attention_head_dim");
  c.classes = num("num_embeds_ada_norm");
  c.norm_eps = j.contains("norm_eps") && j["norm_eps"].is_number() ? j["norm_eps"].get<double>() : 1e-5;
  c.frequencies = 256;
  c.seq = c.sample % c.patch == 0 ? (c.sample / c.patch) * (c.sample / c.patch) : 0;
  validate(c, {}, false, 1);
  return c;
}

// Every weft parameter of a DiT of configuration c, made from diffusers' tensors as read(name)
// gives them (the model's weights, or anything laid out as they are: their gradients).
inline std::vector<checkpoint::ImportedTensor> diffusers_tensors(
    const Config& c, std::function<std::vector<double>(const std::string&)> read) {
  using checkpoint::ImportedTensor;
  const std::int64_t C = c.width, F = c.patch_features(), p = c.patch, Cin = c.in_channels, hd = c.head_dim();
  std::vector<ImportedTensor> out;
  auto plain = [&](std::string weft, std::string from, std::vector<std::int64_t> shape) {
    out.push_back({std::move(weft), std::move(shape), [read, from](std::vector<double>& w) {
                     const auto v = read(from);
                     std::copy_n(v.begin(), w.size(), w.begin());
                   }});
  };
  auto rows = [&](std::string weft, std::string from, std::vector<std::int64_t> shape, std::int64_t first) {
    const std::int64_t cols = shape.size() == 2 ? shape[1] : 1;
    out.push_back({std::move(weft), std::move(shape), [read, from, first, cols](std::vector<double>& w) {
                     const auto v = read(from);
                     std::copy_n(v.begin() + first * cols, w.size(), w.begin());
                   }});
  };
  out.push_back({"patch.in_proj.weight", {C, F}, [read, C, Cin, p](std::vector<double>& w) {
                   const auto v = read("pos_embed.proj.weight");  // (C, Cin, p, p)
                   for (std::int64_t o = 0; o < C; ++o)
                     for (std::int64_t r = 0; r < p; ++r)
                       for (std::int64_t q = 0; q < p; ++q)
                         for (std::int64_t ch = 0; ch < Cin; ++ch)
                           w[static_cast<std::size_t>(o * p * p * Cin + (r * p + q) * Cin + ch)] =
                               v[static_cast<std::size_t>(((o * Cin + ch) * p + r) * p + q)];
                 }});
  plain("patch.in_proj.bias", "pos_embed.proj.bias", {C});
  const std::string emb = "transformer_blocks.0.norm1.emb.";
  plain("t_embedder.fc1.weight", emb + "timestep_embedder.linear_1.weight", {C, c.frequencies});
  plain("t_embedder.fc1.bias", emb + "timestep_embedder.linear_1.bias", {C});
  plain("t_embedder.fc2.weight", emb + "timestep_embedder.linear_2.weight", {C, C});
  plain("t_embedder.fc2.bias", emb + "timestep_embedder.linear_2.bias", {C});
  plain("y_embedder.table", emb + "class_embedder.embedding_table.weight", {c.classes + 1, C});
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string w = cat("blocks.", l, "."), h = cat("transformer_blocks.", l, ".");
    const std::int64_t at[4] = {0, 2, 3, 5}, n[4] = {2, 1, 2, 1};
    const char* part[4] = {"mod1", "gate1", "mod2", "gate2"};
    for (int k = 0; k < 4; ++k) {
      rows(w + part[k] + ".weight", h + "norm1.linear.weight", {n[k] * C, C}, at[k] * C);
      rows(w + part[k] + ".bias", h + "norm1.linear.bias", {n[k] * C}, at[k] * C);
    }
    for (const char* kind : {"weight", "bias"}) {
      const bool weight = std::string(kind) == "weight";
      const std::int64_t cols = weight ? C : 1;
      out.push_back(
          {w + "attn.qkv." + kind, weight ? std::vector<std::int64_t>{3 * C, C} : std::vector<std::int64_t>{3 * C},
           [read, h, kind, hd, cols, C](std::vector<double>& v) {
             const std::vector<double> src[3] = {read(h + "attn1.to_q." + kind), read(h + "attn1.to_k." + kind),
                                                 read(h + "attn1.to_v." + kind)};
             for (std::int64_t r = 0; r < 3 * C; ++r) {
               const std::int64_t head = r / (3 * hd), slot = (r / hd) % 3, d = r % hd;
               std::copy_n(src[slot].begin() + (head * hd + d) * cols, cols, v.begin() + r * cols);
             }
           }});
    }
    plain(w + "attn.proj.weight", h + "attn1.to_out.0.weight", {C, C});
    plain(w + "attn.proj.bias", h + "attn1.to_out.0.bias", {C});
    plain(w + "mlp.fc.weight", h + "ff.net.0.proj.weight", {4 * C, C});
    plain(w + "mlp.fc.bias", h + "ff.net.0.proj.bias", {4 * C});
    plain(w + "mlp.proj.weight", h + "ff.net.2.weight", {C, 4 * C});
    plain(w + "mlp.proj.bias", h + "ff.net.2.bias", {C});
  }
  plain("norm.mod.weight", "proj_out_1.weight", {2 * C, C});
  plain("norm.mod.bias", "proj_out_1.bias", {2 * C});
  plain("out_proj.weight", "proj_out_2.weight", {F, C});
  plain("out_proj.bias", "proj_out_2.bias", {F});
  return out;
}

// The diffusers tensors of a DiT of configuration c, with their shapes.
inline std::vector<std::pair<std::string, std::vector<std::int64_t>>> diffusers_shapes(const Config& c) {
  const std::int64_t C = c.width, p = c.patch;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out{
      {"pos_embed.proj.weight", {C, c.in_channels, p, p}},
      {"pos_embed.proj.bias", {C}},
      {"proj_out_1.weight", {2 * C, C}},
      {"proj_out_1.bias", {2 * C}},
      {"proj_out_2.weight", {c.patch_features(), C}},
      {"proj_out_2.bias", {c.patch_features()}}};
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string h = cat("transformer_blocks.", l, ".");
    for (const char* m : {"to_q", "to_k", "to_v", "to_out.0"}) {
      out.push_back({h + "attn1." + m + ".weight", {C, C}});
      out.push_back({h + "attn1." + m + ".bias", {C}});
    }
    out.push_back({h + "ff.net.0.proj.weight", {4 * C, C}});
    out.push_back({h + "ff.net.0.proj.bias", {4 * C}});
    out.push_back({h + "ff.net.2.weight", {C, 4 * C}});
    out.push_back({h + "ff.net.2.bias", {C}});
    out.push_back({h + "norm1.linear.weight", {6 * C, C}});
    out.push_back({h + "norm1.linear.bias", {6 * C}});
    const std::string e = h + "norm1.emb.";
    out.push_back({e + "timestep_embedder.linear_1.weight", {C, c.frequencies}});
    out.push_back({e + "timestep_embedder.linear_1.bias", {C}});
    out.push_back({e + "timestep_embedder.linear_2.weight", {C, C}});
    out.push_back({e + "timestep_embedder.linear_2.bias", {C}});
    out.push_back({e + "class_embedder.embedding_table.weight", {c.classes + 1, C}});
  }
  return out;
}

// Reads a diffusers DiT directory (F64, F32 or BF16) and writes its weights as a weft checkpoint of
// step 0 at `out` (checkpoint::write_imported; load it into any mesh); returns the configuration.
// Everything is checked before anything is written.
inline Config import_diffusers(const std::string& dir, const std::string& out, const Config& base = {}) {
  const Config c = diffusers_config(dir, base);
  const checkpoint::ImportDir files(dir, "diffusion_pytorch_model", cat("dit::import(", dir, ")"));
  const auto shapes = diffusers_shapes(c);
  std::set<std::string> known;
  for (const auto& [name, shape] : shapes) {
    known.insert(name);
    const checkpoint::TensorInfo* t = files.find(name);
    if (!t) throw Error(files.at(), cat("has no tensor ", name), "pass the whole model that config.json describes");
    if (t->shape != shape)
      throw Error(files.at(),
                  cat(name, " has the shape ", join(t->shape, "x"), "; config.json's sizes give ", join(shape, "x")),
                  "pass a config.json that matches the weights");
    if (t->dtype != DType::f32 && t->dtype != DType::bf16 && t->dtype != DType::f64)
      throw Error(files.at(), cat(name, " has dtype ", checkpoint::safetensors_dtype(t->dtype)),
                  "convert it to F32, BF16 or F64");
  }
  for (const auto& name : files.names())
    if (!known.contains(name))
      throw Error(files.at(), cat("has a tensor ", brief(name), " that a DiT of ", c.layers, " blocks does not have"),
                  "pass a DiTTransformer2DModel whose config.json describes every tensor");
  for (std::int64_t l = 1; l < c.layers; ++l)
    for (const char* e :
         {"timestep_embedder.linear_1.weight", "timestep_embedder.linear_1.bias", "timestep_embedder.linear_2.weight",
          "timestep_embedder.linear_2.bias", "class_embedder.embedding_table.weight"}) {
      const std::string mine = cat("transformer_blocks.", l, ".norm1.emb.", e);
      if (files.read(mine) != files.read(cat("transformer_blocks.0.norm1.emb.", e)))
        throw Error(files.at(), cat(mine, " differs from block 0's"),
                    "import a DiT whose blocks share one timestep and label embedder (DiT's); weft's DiT has one");
    }
  checkpoint::write_imported(out, diffusers_tensors(c, [&](const std::string& n) { return files.read(n); }), record(c),
                             c.seed, dir, files.at());
  return c;
}

}  // namespace weft::dit
