// ops::Mask: which keys each query of an attention op sees (ops::Attention, ops::ContextBlock and
// the context-parallel attention built on it), and the layers' choice of it as a type.
//
//   causal   keys at positions after the query's are hidden (language models); false: every key is
//            seen (bidirectional attention: DiT, ViT, encoders)
//   lengths  (B) int32 on the op's device, or null: sample b's keys at positions >= lengths[b] are
//            padding, hidden from every query (a key padding mask: Hugging Face's attention_mask of
//            ones then zeros, as lengths). Queries at padded positions still attend to the valid keys;
//            their outputs are the loss's to ignore. Each length lies in [1, T], so that every query
//            sees at least the key at position 0.
//
// Positions are those of the whole sequence (a context rank holds two chunks of it:
// ops::Positions), so one mask serves the one-rank op and every block of the context-parallel
// attention alike. Under either choice the keys a query sees are a prefix of the sequence: keys(b,
// p, T) of them, what the whole-sequence kernels loop over; sees(b, p, q) is the same test one pair
// at a time, for the blocks of a context rank.
//
// The layers take the choice as a policy type (one policy per type): mask::Causal or
// mask::Bidirectional; padding comes with each batch, as a run-time value (a padded batch's
// lengths, which nn::StagedModel hands the layers through their mesh: nn/padding.hpp).
//
// Example, T = 4, lengths = {3}: causal query 3 sees keys {0, 1, 2}; bidirectional query 0 sees
// keys {0, 1, 2}; key 3 is seen by no query.
//
// This header is plain C++20.
//
// defines: ops::Mask, ops::check_lengths, mask::Causal, mask::Bidirectional, mask::Kind
#pragma once

#include <concepts>
#include <cstdint>
#include <string>

#include "weft/core/error.hpp"
#include "weft/ops/math.hpp"

namespace weft::ops {

struct Mask {
  bool causal = true;
  const std::int32_t* lengths = nullptr;  // (B) on the op's device; null: no padding

  // Whether a query at position qpos of sample b sees the key at kpos.
  WEFT_HD constexpr bool sees(std::int64_t b, std::int64_t qpos, std::int64_t kpos) const {
    return (!causal || kpos <= qpos) && (lengths == nullptr || kpos < lengths[b]);
  }
  // How many keys, from position 0 on, a query at position p of sample b sees in a sequence of Tn.
  WEFT_HD constexpr std::int64_t keys(std::int64_t b, std::int64_t p, std::int64_t Tn) const {
    std::int64_t n = causal ? p + 1 : Tn;
    if (lengths != nullptr && lengths[b] < n) n = lengths[b];
    return n;
  }
};

// Where the lengths are in host memory (the Host device's ops, the callers that make them): each of
// the B lengths in [1, Tn], else an error naming the sample.
inline void check_lengths(const Mask& m, std::int64_t B, std::int64_t Tn, const std::string& where) {
  if (m.lengths == nullptr) return;
  for (std::int64_t b = 0; b < B; ++b)
    if (m.lengths[b] < 1 || m.lengths[b] > Tn)
      throw Error(where, cat("sample ", b, " has ", m.lengths[b], " valid positions of ", Tn),
                  "give each sample a length from 1 to the sequence length (padding at the end)");
}

}  // namespace weft::ops

namespace weft::mask {

// The attention layers' choice (nn::GroupedQueryAttention's Mask).
struct Causal {
  static constexpr bool causal = true;
  static constexpr const char* name = "causal";
};
struct Bidirectional {
  static constexpr bool causal = false;
  static constexpr const char* name = "bidirectional";
};
template <class M>
concept Kind = std::same_as<M, Causal> || std::same_as<M, Bidirectional>;

}  // namespace weft::mask
