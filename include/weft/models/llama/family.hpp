// Llama for the trainer (concept train::Family, train/family.hpp): train_gpt --model llama. The
// model over the precision, the sequence parallelism and the device; the presets ("tiny" is
// llama-tiny, the trainer's default); the FLOPs per token; --init-from a transformers model
// directory. The plan (--plan, and the check that a run fits) is the step measured on the Meta
// device. The trainer compiles every strategy in f32 and bf16 (f64 is the tests' precision), on
// the host and, in CUDA builds, on the GPU (examples/train_gpt_llama_cuda.cu; a binary that
// registers this family under WEFT_ENABLE_CUDA instantiates train::train_on_cuda for it). With
// --context, ContextFamily<Cx> (below): f32 on the host (examples/train_gpt_llama_context.cpp). Where
// the configuration ties the LM head to the embedding table (the llama-3.2-1b preset, a config.json
// with tie_word_embeddings, --tie-embeddings true), TiedFamily (below) in its place
// (examples/train_gpt_llama_tied.cpp).
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

template <context::Kind Cx>
struct ContextFamily;
struct TiedFamily;

// What Llama's families share: the name, the presets, the FLOPs, the summary, the import.
struct Common {
  static std::string name() { return "llama"; }
  static std::vector<std::string> preset_names() {
    return {"tiny", "llama-tiny", "llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"};
  }
  static Config preset(std::string_view n) { return llama::preset(n == "tiny" ? "llama-tiny" : n); }
  static std::string cluster_preset() { return "llama-3.1-8b"; }  // weft-plan --model llama's default
  static double flops_per_token(const Config& c) { return llama::flops_per_token(c); }
  static std::string summary(const Config& c) {
    return cat("layers ", c.layers, ", heads ", c.heads, " (", c.kv_heads, " key-value), width ", c.width, ", hidden ", c.hidden,
               ", seq ", c.seq, ", vocab ", c.vocab, ", rope theta ", c.rope.theta,
               c.rope.factor > 0 ? cat(" (llama3 scaling x", c.rope.factor, ")") : std::string(), c.tied ? ", head tied" : ", head untied");
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
        throw Error(cat("llama::import(", from, ")"),
                    cat("its config.json has ", have[i].first, " ", have[i].second, "; the run's model has ", want[i].second),
                    "choose the preset and sizes of the model in the directory (--layers, --width, --heads, --kv-heads, --hidden, --vocab, "
                    "--tie-embeddings)");
    llama::import_hf(from, dir, c);
  }
};

struct Family : Common {
  template <class P, bool SP, class D>
  using model = Model<P, SP, recompute::None, D>;
  using host_precisions = train::List<F32, Bf16Mixed>;
  // train_gpt --context N --attention ring|all-gather: the family whose model shards the sequence
  // over the context axis, Cx's way (train/main.hpp trains it in this one's place).
  template <context::Kind Cx>
  using with_context = ContextFamily<Cx>;
  // A configuration with `tied` set: the family whose model's head reads the embedding table.
  using with_tied_head = TiedFamily;
};

// Llama whose LM head reads the embedding table (Llama 3.2 1B and 3B; transformers'
// tie_word_embeddings): every strategy, f32 and bf16, host and GPU, as Family; weft-plan plans it
// in bf16. Not with --context (its context-parallel model unties the head: train_gpt refuses a tied
// configuration there by name; with_context is declared so that a binary without the context loops
// names its build option).
struct TiedFamily : Common {
  template <class P, bool SP, class D>
  using model = Model<P, SP, recompute::None, D, true>;
  using host_precisions = train::List<F32, Bf16Mixed>;
  using cluster_precisions = train::List<Bf16Mixed>;
  template <context::Kind Cx>
  using with_context = ContextFamily<Cx>;
};

// Llama with the sequence over the context axis (docs/context.md): the host, f32, every data
// strategy, with or without sequence parallelism (a context rank's rows split again over its
// tensor group); its head untied.
template <context::Kind Cx>
struct ContextFamily : Common {
  using attention = Cx;
  template <class P, bool SP, class D>
  using model = Model<P, SP, recompute::None, D, false, Cx>;
  using host_precisions = train::List<F32>;
  static constexpr bool gpu = false;
};

}  // namespace weft::llama
