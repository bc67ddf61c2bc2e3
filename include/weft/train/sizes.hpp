// defines: train::Sizes, the sizes a command line sets over a model family's preset (--layers,
// --heads, --width, --seq, --vocab, --kv-heads, --hidden, --tie-embeddings, --experts, --top-k,
// --capacity-factor, --router, --expert-bias, --expert-groups); train::preset_config
// (train/family.hpp) applies them. A header of its own so that a model's family, which reads them,
// includes nothing of the trainer's options.
#pragma once

#include <cstdint>
#include <optional>

namespace weft::train {

struct Sizes {
  std::optional<std::int64_t> layers, heads, width, seq, vocab, kv_heads, hidden;
  std::optional<std::int64_t> experts, top_k;      // a mixture of experts': E, and the experts a token goes to
  std::optional<double> capacity_factor;           // and its capacity (0: dropless)
  std::optional<bool> sigmoid;                     // --router: sigmoid scores (true) or softmax
  std::optional<double> expert_bias;               // --expert-bias: an expert bias moved at this rate a step
  std::optional<std::int64_t> groups, top_groups;  // --expert-groups G --top-groups K: group-limited routing
  std::optional<bool> tied;                        // --tie-embeddings: the LM head reads the embedding table
};

}  // namespace weft::train
