// defines: train::Sizes, the sizes a command line sets over a model family's preset (--layers,
// --heads, --width, --seq, --vocab, --kv-heads, --hidden, --tie-embeddings); train::preset_config
// (train/family.hpp) applies them. A header of its own so that a model's family, which reads them,
// includes nothing of the trainer's options.
#pragma once

#include <cstdint>
#include <optional>

namespace weft::train {

struct Sizes {
  std::optional<std::int64_t> layers, heads, width, seq, vocab, kv_heads, hidden;
  std::optional<bool> tied;  // --tie-embeddings: the LM head reads the embedding table
};

}  // namespace weft::train
