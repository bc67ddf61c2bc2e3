// Llama for the trainer (concept train::Family, train/family.hpp): weft-train --model llama. The
// model over the precision, the sequence parallelism, the device and the variant; the presets
// ("tiny" is llama-tiny, the trainer's default); the FLOPs per token; --init-from a transformers
// model directory and weft-export to one. Its variants: the LM head untied or tied to the embedding
// table (the llama-3.2-1b preset, a config.json with tie_word_embeddings, --tie-embeddings true),
// and, untied, the sequence over the context axis (--context, ring or all-gather attention: f32 on
// the host). The plan (--plan, and the check that a run fits) is the step measured on the Meta
// device. The trainer compiles every strategy in f32 and bf16 (f64 is the tests' precision).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/models/llama/config.hpp"
#include "weft/models/llama/hf.hpp"
#include "weft/models/llama/model.hpp"
#include "weft/train/family.hpp"

namespace weft::llama {

struct Family {
  template <class P, bool SP, class D, class V>
  using model = Model<P, SP, recompute::None, D, V::tied, typename V::context>;
  using variants = train::List<train::Variant<>, train::Variant<context::None, true>, train::Variant<context::Ring>,
                               train::Variant<context::AllGather>>;
  using host_precisions = train::List<F32, Bf16Mixed>;

  static std::string name() { return "llama"; }
  static std::vector<std::string> preset_names() {
    return {"tiny", "llama-tiny", "llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"};
  }
  static Config preset(std::string_view n) { return llama::preset(n == "tiny" ? "llama-tiny" : n); }
  static std::string cluster_preset() { return "llama-3.1-8b"; }  // weft-plan --model llama's default
  static double flops_per_token(const Config& c) { return llama::flops_per_token(c); }
  static std::string summary(const Config& c) {
    return cat("layers ", c.layers, ", heads ", c.heads, " (", c.kv_heads, " key-value), width ", c.width, ", hidden ",
               c.hidden, ", seq ", c.seq, ", vocab ", c.vocab, ", rope theta ", c.rope.theta,
               c.rope.factor > 0 ? cat(" (llama3 scaling x", c.rope.factor, ")") : std::string(),
               c.tied ? ", head tied" : ", head untied");
  }
  // --init-from DIR without --preset: the run's model is the one config.json describes (its sizes,
  // rotary parameters and head tie; base's sequence length and seed).
  static Config config_from_hf(const std::string& from, const Config& base) { return llama::hf_config_of(from, base); }
  // --init-from DIR: a transformers LlamaForCausalLM directory, whose config.json must describe the
  // run's model (every field of the record; the first that differs is named).
  // Compared before anything is converted (the conversion of a large model takes minutes and
  // gigabytes of $TMPDIR).
  static void import_hf(const std::string& from, const std::string& dir, const Config& c) {
    const Config got = llama::hf_config_of(from, c);
    const auto want = record(c), have = record(got);
    for (std::size_t i = 0; i < want.size(); ++i)
      if (want[i] != have[i])
        throw Error(
            cat("llama::import(", from, ")"),
            cat("its config.json has ", have[i].first, " ", have[i].second, "; the run's model has ", want[i].second),
            "choose the preset and sizes of the model in the directory (--layers, --width, --heads, --kv-heads, --hidden, --vocab, "
            "--tie-embeddings)");
    llama::import_hf(from, dir, c);
  }
  // weft-export: a LlamaForCausalLM directory, in F32 or F64 (exact), sharded past 5 GB or the
  // given size as save_pretrained shards.
  static Config config_of(const checkpoint::Manifest& m) { return llama::config_of(m); }
  static void export_hf(const std::string& checkpoint, const std::string& out, const checkpoint::ExportOptions& e) {
    llama::export_hf(checkpoint, out, e.dtype.value_or(DType::f32), e.max_shard_bytes.value_or(5'000'000'000));
  }
};

}  // namespace weft::llama
