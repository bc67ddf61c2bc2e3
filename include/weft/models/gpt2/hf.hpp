// Hugging Face GPT-2 names and layouts: export a weft checkpoint as a safetensors file that
// transformers.GPT2LMHeadModel loads, and import such a file as a run's initial weights.
//
//   weft (model.hpp)                       Hugging Face (GPT2LMHeadModel)
//   wte (V, C)                             transformer.wte.weight (V, C)      (lm_head is tied to it)
//   wpe (T, C)                             transformer.wpe.weight (T, C)      n_positions = T
//   h<l>.ln1.{weight,bias} (C)             transformer.h.<l>.ln_1.{weight,bias}
//   h<l>.attn.qkv.weight (3C, C)           transformer.h.<l>.attn.c_attn.weight (C, 3C)
//       rows (head, {q,k,v}, hd)               Conv1D: (in, out), columns ({q,k,v}, head, hd)
//   h<l>.attn.qkv.bias (3C)                transformer.h.<l>.attn.c_attn.bias (3C), ({q,k,v}, head, hd)
//   h<l>.attn.proj.weight (C, C)           transformer.h.<l>.attn.c_proj.weight, transposed
//   h<l>.ln2.{weight,bias}                 transformer.h.<l>.ln_2.{weight,bias}
//   h<l>.mlp.fc.weight (4C, C)             transformer.h.<l>.mlp.c_fc.weight (C, 4C), transposed
//   h<l>.mlp.proj.weight (C, 4C)           transformer.h.<l>.mlp.c_proj.weight (4C, C), transposed
//   (biases under the same names)
//   ln_f.{weight,bias}                     transformer.ln_f.{weight,bias}
//
// Both models use pre-LayerNorm blocks with eps 1e-5, GELU with the tanh approximation ("gelu_new")
// and no dropout at inference, so the same weights give the same logits (tools/reference/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "weft/checkpoint/checkpoint.hpp"
#include "weft/checkpoint/export_dir.hpp"
#include "weft/core/files.hpp"
#include "weft/core/json_limits.hpp"
#include "weft/models/gpt2/config.hpp"

namespace weft::gpt2 {

// The model sizes a checkpoint's manifest records, checked as a model's would be.
inline Config config_of(const checkpoint::Manifest& m) {
  Config c;
  auto field = [&](const char* k) {
    const auto it = m.model.find(k);
    if (it == m.model.end() || !it->is_number_integer())
      throw Error("gpt2", cat("the checkpoint's manifest records no integer ", k, " for its model"),
                  "export a checkpoint saved from gpt2::Model (vocab, seq, layers, heads, width)");
    return it->get<std::int64_t>();
  };
  c.vocab = field("vocab");
  c.seq = field("seq");
  c.layers = field("layers");
  c.heads = field("heads");
  c.width = field("width");
  gpt2::validate(c, {}, false, 1);
  return c;
}

// transformers' config.json for these sizes.
inline nlohmann::json hf_config(const Config& c) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab},
          {"n_positions", c.seq},
          {"n_ctx", c.seq},
          {"n_embd", c.width},
          {"n_layer", c.layers},
          {"n_head", c.heads},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"bos_token_id", c.vocab - 1},
          {"eos_token_id", c.vocab - 1},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"tie_word_embeddings", true}};
}

namespace detail {

// Column j of c_attn (({q,k,v}, head, hd)) is row qkv_row(j) of weft's qkv ((head, {q,k,v}, hd)).
inline std::int64_t qkv_row(std::int64_t j, std::int64_t C, std::int64_t heads) {
  const std::int64_t hd = C / heads, s = j / C, h = (j % C) / hd, d = j % hd;
  return h * 3 * hd + s * hd + d;
}

// out (cols, rows) = in (rows, cols) transposed.
inline std::vector<float> transpose(const std::vector<float>& in, std::int64_t rows, std::int64_t cols) {
  std::vector<float> out(in.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(c * rows + r)] = in[static_cast<std::size_t>(r * cols + c)];
  return out;
}

struct Named {
  std::string weft, hf;
  bool transposed = false, qkv = false;
};

inline std::vector<Named> names(std::int64_t layers) {
  std::vector<Named> n{{"wte", "transformer.wte.weight"}, {"wpe", "transformer.wpe.weight"}};
  for (std::int64_t l = 0; l < layers; ++l) {
    const std::string w = cat("h", l, "."), h = cat("transformer.h.", l, ".");
    n.push_back({w + "ln1.weight", h + "ln_1.weight"});
    n.push_back({w + "ln1.bias", h + "ln_1.bias"});
    n.push_back({w + "attn.qkv.weight", h + "attn.c_attn.weight", true, true});
    n.push_back({w + "attn.qkv.bias", h + "attn.c_attn.bias", false, true});
    n.push_back({w + "attn.proj.weight", h + "attn.c_proj.weight", true});
    n.push_back({w + "attn.proj.bias", h + "attn.c_proj.bias"});
    n.push_back({w + "ln2.weight", h + "ln_2.weight"});
    n.push_back({w + "ln2.bias", h + "ln_2.bias"});
    n.push_back({w + "mlp.fc.weight", h + "mlp.c_fc.weight", true});
    n.push_back({w + "mlp.fc.bias", h + "mlp.c_fc.bias"});
    n.push_back({w + "mlp.proj.weight", h + "mlp.c_proj.weight", true});
    n.push_back({w + "mlp.proj.bias", h + "mlp.c_proj.bias"});
  }
  n.push_back({"ln_f.weight", "transformer.ln_f.weight"});
  n.push_back({"ln_f.bias", "transformer.ln_f.bias"});
  return n;
}

// weft's layout of a tensor -> Hugging Face's (shape in weft's order).
inline std::vector<float> to_hf(const Named& n, const std::vector<float>& v, const std::vector<std::int64_t>& shape,
                                const Config& c) {
  std::vector<float> x = v;
  if (n.qkv) {  // permute weft's rows into Hugging Face's ({q,k,v}, head, hd) order
    const std::int64_t rows = 3 * c.width, cols = shape.size() == 2 ? shape[1] : 1;
    for (std::int64_t j = 0; j < rows; ++j)
      std::copy_n(v.begin() + qkv_row(j, c.width, c.heads) * cols, cols, x.begin() + j * cols);
  }
  if (n.transposed) x = transpose(x, shape[0], shape[1]);
  return x;
}

// Hugging Face's layout -> weft's (shape in weft's order).
inline std::vector<float> from_hf(const Named& n, const std::vector<float>& v, const std::vector<std::int64_t>& shape,
                                  const Config& c) {
  std::vector<float> x = n.transposed ? transpose(v, shape[1], shape[0]) : v;
  if (n.qkv) {
    std::vector<float> y(x.size());
    const std::int64_t rows = 3 * c.width, cols = shape.size() == 2 ? shape[1] : 1;
    for (std::int64_t j = 0; j < rows; ++j)
      std::copy_n(x.begin() + j * cols, cols, y.begin() + qkv_row(j, c.width, c.heads) * cols);
    x = std::move(y);
  }
  return x;
}

inline std::vector<std::int64_t> hf_shape(const Named& n, const std::vector<std::int64_t>& weft_shape) {
  return n.transposed ? std::vector<std::int64_t>{weft_shape[1], weft_shape[0]} : weft_shape;
}

}  // namespace detail

// Writes the parameters of the checkpoint at `checkpoint` (any mesh, strategy, precision) as a
// Hugging Face GPT-2 safetensors file (f32) at `out`, and transformers' config.json beside it.
inline void export_hf(const std::string& checkpoint, const std::string& out) {
  using namespace weft::checkpoint;
  const Reader r(checkpoint);
  const Config c = config_of(r.manifest());
  std::vector<std::vector<float>> data;
  std::vector<TensorData> tensors;
  const auto names = detail::names(c.layers);
  data.reserve(names.size());
  for (const auto& n : names) {
    const std::string src = r.has("master/" + n.weft) ? "master/" + n.weft : "param/" + n.weft;
    const auto& shape = r.shape(src);
    data.push_back(detail::to_hf(n, r.read<float>(src), shape, c));
    tensors.push_back({n.hf, DType::f32, detail::hf_shape(n, shape), data.back().data()});
  }
  // The file and config.json beside it, through checkpoint::ExportDir: never into the checkpoint,
  // never over a file an earlier export did not write, each through a .tmp and a rename.
  const std::filesystem::path file(out);
  ExportDir dir(file.parent_path().string(), checkpoint);
  dir.write(file.filename().string(), [&](const std::string& tmp) { write(tmp, tensors, {{"format", "pt"}}); });
  dir.write_text("config.json", hf_config(c).dump(2) + "\n");
  dir.commit();
}

// Reads a Hugging Face GPT-2 safetensors file (F32, BF16 or F64) and writes it as a weft checkpoint
// of step 0 (parameters only, consolidated) at `dir`, for a model of sizes c; load it with
// load(dir, model, dp, mesh, {.optimizer = false}). Every tensor is checked against c's shape.
inline void import_hf(const std::string& file, const std::string& dir, const Config& c) {
  using namespace weft::checkpoint;
  const Header h = read_header(file);
  const auto at = cat("gpt2::import(", file, ")");
  checkpoint::detail::Fd fd(file, O_RDONLY);
  std::vector<checkpoint::detail::Staged> staged;
  auto expect = [&](const std::string& n) -> std::vector<std::int64_t> {
    const std::int64_t C = c.width;
    if (n == "wte") return {c.vocab, C};
    if (n == "wpe") return {c.seq, C};
    if (n.ends_with("qkv.weight")) return {3 * C, C};
    if (n.ends_with("qkv.bias")) return {3 * C};
    if (n.ends_with("fc.weight")) return {4 * C, C};
    if (n.ends_with("fc.bias")) return {4 * C};
    if (n.ends_with("mlp.proj.weight")) return {C, 4 * C};
    if (n.ends_with("attn.proj.weight")) return {C, C};
    return {C};
  };
  const auto names = detail::names(c.layers);
  for (const auto& n : names) {
    const TensorInfo* t = h.find(n.hf);
    if (!t)
      throw Error(at, cat("has no tensor ", n.hf),
                  cat("export a GPT-2 of ", c.layers, " layers, or choose the sizes of this file"));
    const auto shape = expect(n.weft), hf = detail::hf_shape(n, shape);
    if (t->shape != hf)
      throw Error(at, cat(n.hf, " has the shape ", join(t->shape, "x"), "; a GPT-2 of these sizes has ", join(hf, "x")),
                  "pass the sizes of the file (--layers, --heads, --width, --seq, --vocab)");
    if (t->dtype != DType::f32 && t->dtype != DType::bf16 && t->dtype != DType::f64)
      throw Error(at, cat(n.hf, " has dtype ", safetensors_dtype(t->dtype)), "convert it to F32, BF16 or F64");
  }
  // Nothing beside them but the buffers transformers may save (the causal masks) and the LM head
  // tied to wte: a tensor past them (a block of a deeper model, a part of another one) is refused.
  std::set<std::string> known;
  for (const auto& n : names) known.insert(n.hf);
  for (const TensorInfo& t : h.tensors) {
    if (known.contains(t.name) || t.name.ends_with(".attn.bias") || t.name.ends_with(".attn.masked_bias")) continue;
    if (t.name == "lm_head.weight" && t.shape == std::vector<std::int64_t>{c.vocab, c.width}) continue;
    throw Error(at,
                cat("has a tensor ", brief(t.name), " that a GPT-2 of ", c.layers, " layers, ", c.heads,
                    " heads and width ", c.width, " does not have"),
                "pass the sizes of the file (--layers, --heads, --width, --seq, --vocab), or a GPT-2 file");
  }
  // The head count is in no tensor's shape (c_attn is (C, 3C) for any): transformers' config.json
  // beside the file records it, with the other sizes.
  const auto config = std::filesystem::path(file).parent_path() / "config.json";
  if (!std::filesystem::is_regular_file(config))
    throw Error(
        at,
        cat("has no config.json beside it (", config.string(), "): the head count of a GPT-2 is not in its tensors"),
        "put the model's transformers config.json beside the file (weft-export writes one)");
  nlohmann::json hf;
  {
    const std::string text = read_text_file(config.string(), 1 << 20, cat("gpt2::import(", config.string(), ")"));
    check_json_limits(text, {.max_bytes = 1 << 20, .max_depth = 8}, cat("gpt2::import(", config.string(), ")"));
    try {
      hf = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat("gpt2::import(", config.string(), ")"), cat("is not valid JSON (", brief(e.what(), 200), ")"),
                  "pass transformers' config.json");
    }
  }
  for (const auto& [k, v] : std::vector<std::pair<const char*, std::int64_t>>{{"n_layer", c.layers},
                                                                              {"n_head", c.heads},
                                                                              {"n_embd", c.width},
                                                                              {"n_positions", c.seq},
                                                                              {"vocab_size", c.vocab}})
    if (!hf.is_object() || !hf.contains(k) || !hf[k].is_number_integer() || hf[k].get<std::int64_t>() != v)
      throw Error(cat("gpt2::import(", config.string(), ")"),
                  cat("has ", k, " ", hf.is_object() && hf.contains(k) ? brief(hf[k].dump()) : std::string("(none)"),
                      "; this model has ", v),
                  "pass the sizes of the file (--layers, --heads, --width, --seq, --vocab)");
  for (const auto& n : names) {
    const TensorInfo* t = h.find(n.hf);
    const auto shape = expect(n.weft);
    const std::size_t count = t->end - t->begin, es = size_of(t->dtype);
    std::vector<std::byte> raw(count);
    fd.read_all_at(raw.data(), raw.size(), h.data_start + t->begin);
    std::vector<float> v(count / es);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = checkpoint::detail::convert_element<float>(t->dtype, raw.data() + i * es);
    const auto w = detail::from_hf(n, v, shape, c);
    checkpoint::detail::Staged s{"param/" + n.weft,
                                 DType::f32,
                                 shape,
                                 shape,
                                 std::vector<std::int64_t>(shape.size(), 0),
                                 shape,
                                 "imported",
                                 0,
                                 static_cast<std::int64_t>(w.size()),
                                 std::vector<std::byte>(w.size() * sizeof(float))};
    std::memcpy(s.bytes.data(), w.data(), s.bytes.size());
    staged.push_back(std::move(s));
  }
  std::filesystem::create_directories(dir);
  Manifest m;
  m.policy = "consolidated";
  for (const auto& [k, v] : gpt2::record(c)) m.model[k] = v;
  m.optimizer = {{"rule", "none"}, {"steps", 0}, {"skipped", 0}};
  m.run = {{"step", 0}, {"loader_position", 0}, {"seed", c.seed}, {"imported_from", file}};
  m.strategy = "imported";
  m.precision = "f32";
  m.add_file({"model.safetensors", checkpoint::detail::write_staged(cat(dir, "/model.safetensors"), staged)});
  checkpoint::add_pieces(m, dir, "model.safetensors");
  write_atomic(cat(dir, "/manifest.json"), to_json(m).dump(1));
}

}  // namespace weft::gpt2
