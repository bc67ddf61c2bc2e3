// A trainer's source of training sequences and of held-out ones, whatever the corpus: the built-in
// Markov chain (whose entropy rate is the loss floor), an llm.c token file, or a text file as bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "weft/data/corpus.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/train/options.hpp"

namespace weft::train {

struct Corpus {
  std::unique_ptr<data::MarkovSource> markov;
  std::unique_ptr<data::TokenFile> file;
  std::unique_ptr<data::WindowCorpus> windows;

  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t n) const {
    if (markov) markov->sequence(k, out, n);
    else windows->sequence(k, out, n);
  }
  void held_out(std::uint64_t k, std::int32_t* out, std::int64_t n) const {
    if (markov) markov->sequence((std::uint64_t{1} << 40) + k, out, n);  // sequences training never reads
    else
      windows->held_out(static_cast<std::int64_t>(k % static_cast<std::uint64_t>(windows->held_out_sequences(n))), out,
                        n);
  }
  std::optional<double> floor() const { return markov ? std::optional(markov->entropy_rate()) : std::nullopt; }

  // The options' corpus for a model of `vocab` tokens and sequences of `seq`: --data-file, --text,
  // or the built-in chain seeded by --seed. Throws weft::Error for a file that cannot serve.
  static Corpus open(const DataOptions& d, std::uint64_t seed, std::int64_t vocab, std::int64_t seq) {
    Corpus c;
    if (!d.file.empty()) {
      c.file = std::make_unique<data::TokenFile>(d.file, vocab);
      c.windows = std::make_unique<data::WindowCorpus>(data::WindowCorpus::of_file(*c.file, seed));
      c.windows->require_windows(seq + 1);
    } else if (!d.text.empty()) {
      c.windows = std::make_unique<data::WindowCorpus>(data::WindowCorpus::from_text_file(d.text, seed));
      c.windows->require_windows(seq + 1);
    } else {
      c.markov = std::make_unique<data::MarkovSource>(vocab, seed);
    }
    return c;
  }
};

// The held-out sequences as a source for a data::Loader.
struct HeldOut {
  const Corpus* c;
  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t n) const { c->held_out(k, out, n); }
};

}  // namespace weft::train
