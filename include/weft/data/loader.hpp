// Deterministic batches over the data axis.
//
// Step s of a global batch of B sequences reads sequences s B .. s B + B - 1 of the source; data
// rank d of dp takes its contiguous slice of B / dp of them. The global batch is therefore the same
// for every strategy and every data degree, and the position (the step) is all the state there is:
// save it with position(), restore it with seek().
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <vector>

#include "weft/core/error.hpp"

namespace weft::data {

template <class S>
concept SequenceSource =
    requires(const S& s, std::uint64_t k, std::int32_t* out, std::int64_t n) { s.sequence(k, out, n); };

template <SequenceSource Source>
class Loader {
 public:
  Loader(const Source& source, std::int64_t seq, std::int64_t global_batch, int data_degree, int data_index)
      : source_(&source), T_(seq), B_(global_batch), dp_(data_degree), index_(data_index) {
    if (seq < 1 || global_batch < 1 || data_degree < 1 || data_index < 0 || data_index >= data_degree ||
        global_batch % data_degree != 0)
      throw Error("Loader",
                  cat("sequence length ", seq, ", global batch ", global_batch, ", data rank ", data_index, " of ",
                      data_degree),
                  "use positive sizes and a global batch divisible by the data degree");
  }

  std::int64_t local_batch() const { return B_ / dp_; }

  // Fills this rank's (B / dp, T) inputs and their next-token targets, and advances one step.
  void next(std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) {
    const std::int64_t b = local_batch();
    tokens.resize(static_cast<std::size_t>(b * T_));
    targets.resize(tokens.size());
    std::vector<std::int32_t> window(static_cast<std::size_t>(T_ + 1));
    for (std::int64_t i = 0; i < b; ++i) {
      const auto k = static_cast<std::uint64_t>(step_ * B_ + index_ * b + i);
      source_->sequence(k, window.data(), T_ + 1);
      for (std::int64_t t = 0; t < T_; ++t) {
        tokens[static_cast<std::size_t>(i * T_ + t)] = window[static_cast<std::size_t>(t)];
        targets[static_cast<std::size_t>(i * T_ + t)] = window[static_cast<std::size_t>(t + 1)];
      }
    }
    ++step_;
  }

  std::int64_t position() const { return step_; }
  // Steps run from 0 to the largest whose sequence indices (step x global batch) fit in 63 bits.
  void seek(std::int64_t step) {
    const std::int64_t most = std::numeric_limits<std::int64_t>::max() / B_ - 1;
    if (step < 0 || step > most)
      throw Error("Loader::seek", cat("step ", step, " with a global batch of ", B_),
                  cat("use a step in [0, ", most, "]"));
    step_ = step;
  }

 private:
  const Source* source_;
  std::int64_t T_, B_;
  int dp_, index_;
  std::int64_t step_ = 0;
};

}  // namespace weft::data
