// Corpora of real tokens (an llm.c token file, or text through the byte-level tokenizer) as
// random-access sequences, and the byte-level tokenizer itself.
//
// A corpus is split into a training region (the first 90% of tokens) and a held-out region (the
// rest). Training sequence k is the window at an offset drawn from Philox keyed by (seed, k) inside
// the training region; held-out sequence k is the k-th consecutive window of the held-out region.
#pragma once

#include <cstdint>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/philox.hpp"
#include "weft/data/token_file.hpp"

namespace weft::data {

// Byte-level tokenizer: vocabulary 256, token = byte value.
struct ByteTokenizer {
  static constexpr std::int64_t vocab = 256;
  static std::vector<std::uint16_t> encode(std::string_view text) {
    return std::vector<std::uint16_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                      reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  }
  template <class Int>
  static std::string decode(std::span<const Int> tokens) {
    std::string s;
    for (Int t : tokens) s.push_back(static_cast<char>(static_cast<unsigned char>(t)));
    return s;
  }
};

class WindowCorpus {
 public:
  // Tokens owned by the corpus (text), or viewed (a token file that outlives the corpus).
  explicit WindowCorpus(std::vector<std::uint16_t> owned, std::uint64_t seed = 1)
      : owned_(std::move(owned)), tokens_(owned_), seed_(seed) {
    split();
  }
  WindowCorpus(const TokenFile& file, std::uint64_t seed = 1) : tokens_(file.tokens()), seed_(seed) { split(); }
  // Moving keeps the owned buffer (and so the view of it); copying would not, so it is not allowed.
  WindowCorpus(WindowCorpus&&) = default;
  WindowCorpus(const WindowCorpus&) = delete;
  WindowCorpus& operator=(const WindowCorpus&) = delete;

  static WindowCorpus from_text_file(const std::string& path, std::uint64_t seed = 1) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(cat("WindowCorpus(", path, ")"), "cannot open the text file", "check the path");
    std::stringstream ss;
    ss << f.rdbuf();
    return WindowCorpus(ByteTokenizer::encode(ss.str()), seed);
  }

  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::int64_t train_size() const { return train_; }

  // Checks that windows of `length` tokens fit in both regions.
  void require_windows(std::int64_t length) const {
    if (train_ < length + 1 || size() - train_ < length)
      throw Error("WindowCorpus",
                  cat(size(), " tokens (", train_, " for training, ", size() - train_,
                      " held out) are too few for windows of ", length, " tokens"),
                  "use a shorter sequence length or a larger corpus");
  }

  // Training sequence k: `length` tokens at a Philox-drawn offset of the training region.
  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t length) const {
    const auto span = static_cast<std::uint64_t>(train_ - length + 1);
    const std::uint64_t offset = (static_cast<std::uint64_t>(philox(seed_, 7, k)[0]) << 32 | philox(seed_, 7, k)[1]) % span;
    for (std::int64_t t = 0; t < length; ++t) out[t] = tokens_[offset + static_cast<std::uint64_t>(t)];
  }
  // Held-out sequence k (k < held_out_sequences(length)).
  std::int64_t held_out_sequences(std::int64_t length) const { return (size() - train_) / length; }
  void held_out(std::int64_t k, std::int32_t* out, std::int64_t length) const {
    const std::int64_t offset = train_ + k * length;
    for (std::int64_t t = 0; t < length; ++t) out[t] = tokens_[static_cast<std::size_t>(offset + t)];
  }

 private:
  void split() { train_ = size() * 9 / 10; }
  std::vector<std::uint16_t> owned_;
  std::span<const std::uint16_t> tokens_;
  std::uint64_t seed_;
  std::int64_t train_ = 0;
};

}  // namespace weft::data
