// Corpora of real tokens (an llm.c token file, or text through the byte-level tokenizer) as
// random-access sequences, and the byte-level tokenizer itself.
//
// A corpus is split into a training region (the first 90% of tokens) and a held-out region (the
// rest). Training sequence k is the window at an offset drawn from Philox keyed by (seed, k) inside
// the training region; held-out sequence k is the k-th consecutive window of the held-out region.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/files.hpp"
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

  // A text file's bytes as tokens. A directory, a FIFO, a device or an empty file is refused,
  // naming the file.
  static WindowCorpus from_text_file(const std::string& path, std::uint64_t seed = 1) {
    const std::string where = cat("WindowCorpus(", path, ")");
    (void)require_regular_file(path, where, "a text file");
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(where, "cannot open the text file", "check its permissions");
    std::stringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw Error(where, "reading the text file failed", "check the file");
    if (ss.str().empty())
      throw Error(where, "the text file is empty", "give a text with at least a few sequences of bytes");
    WindowCorpus c(ByteTokenizer::encode(ss.str()), seed);
    c.source_ = path;
    return c;
  }

  // The corpus of a token file: messages name the file.
  static WindowCorpus of_file(const TokenFile& file, std::uint64_t seed = 1) {
    WindowCorpus c(file, seed);
    c.source_ = file.path();
    return c;
  }

  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::int64_t train_size() const { return train_; }

  // Checks that windows of `length` tokens fit in both regions.
  void require_windows(std::int64_t length) const {
    if (train_ < length + 1 || size() - train_ < length)
      throw Error(
          source_.empty() ? std::string("WindowCorpus") : cat("WindowCorpus(", source_, ")"),
          cat(size(), " tokens (", train_, " for training, ", size() - train_, " held out) are too few for windows of ",
              length, " tokens"),
          cat("use a sequence length of at most ", std::max<std::int64_t>(0, std::min(train_ - 1, size() - train_)),
              ", or a larger corpus (at least ", (length + 1) * 10, " tokens)"));
  }

  // Training sequence k: `length` tokens at a Philox-drawn offset of the training region.
  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t length) const {
    const auto span = static_cast<std::uint64_t>(train_ - length + 1);
    const std::uint64_t offset =
        (static_cast<std::uint64_t>(philox(seed_, 7, k)[0]) << 32 | philox(seed_, 7, k)[1]) % span;
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
  std::string source_;  // the file, for messages
};

}  // namespace weft::data
