// A built-in synthetic corpus whose entropy is known: a seeded first-order Markov source over V
// tokens. Each row of the transition matrix puts 0.98 of its mass on a few successors (weights from
// Philox, sharpened), so a small model can learn it, and spreads 0.02 evenly over all V tokens,
// which keeps the chain ergodic; the entropy rate
//   H = sum_i pi_i H(P_i)          (pi the stationary distribution)
// is computed exactly (power iteration in double), and a trained model's loss on fresh sequences
// cannot go below it: the trainer reports its loss next to this floor.
//
// The matrix is kept as what it is, a few successors per row over a uniform floor: O(V x
// successors) memory and time, so a GPT-2 or Llama 3 vocabulary (50257, 128256 tokens) builds in
// well under a second. (A dense V x V table, as this was first written, takes 40 GB and minutes
// at V = 50257.) A draw picks the floor with probability 0.02 and then a uniform token, else a
// successor by its weight: exactly P_i.
//
// Sequences are random access: sequence k starts from a state drawn from pi and takes its steps
// from Philox keyed by (seed, k), so batch contents do not depend on who reads them or in what
// order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/philox.hpp"

namespace weft::data {

class MarkovSource {
 public:
  // The largest vocabulary: O(V) doubles and O(V x successors) entries stay well under a GiB.
  static constexpr std::int64_t max_vocab = std::int64_t{1} << 24;

  MarkovSource(std::int64_t vocab, std::uint64_t seed, int successors = 4) : V_(vocab), seed_(seed), k_(successors) {
    if (vocab < 2 || vocab > max_vocab)
      throw Error("MarkovSource", cat("vocabulary of ", vocab, " tokens"), cat("use 2 to ", max_vocab, " tokens"));
    if (successors < 1 || successors > vocab)
      throw Error("MarkovSource", cat(successors, " successors for ", vocab, " tokens"), "use 1 to vocab successors");
    floor_ = kNoise / static_cast<double>(V_);
    to_.resize(static_cast<std::size_t>(V_ * k_));
    mass_.resize(to_.size());
    for (std::int64_t i = 0; i < V_; ++i) {
      // Row i: k (successor, weight) pairs, merged where Philox repeats a successor, in token order.
      std::int64_t* to = to_.data() + i * k_;
      double* w = mass_.data() + i * k_;
      double total = 0;
      for (int s = 0; s < k_; ++s) {
        to[s] = static_cast<std::int64_t>(
            philox(seed, 1000 + static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(s))[0] %
            static_cast<std::uint64_t>(V_));
        w[s] = std::exp(1.5 * weft::normal(seed, 2000 + static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(s)));
        total += w[s];
      }
      for (int a = 1; a < k_; ++a)  // by token (k is a handful: insertion sort)
        for (int b = a; b > 0 && to[b - 1] > to[b]; --b) {
          std::swap(to[b - 1], to[b]);
          std::swap(w[b - 1], w[b]);
        }
      for (int s = 1, head = 0; s < k_; ++s) {  // a repeated successor's weight goes to its first entry
        if (to[s] != to[head]) {
          head = s;
          continue;
        }
        w[head] += w[s];
        w[s] = 0;
      }
      for (int s = 0; s < k_; ++s) w[s] = (1 - kNoise) * w[s] / total;  // each successor's share of the row
    }
    stationary();
    pi_cdf_.resize(static_cast<std::size_t>(V_));
    double c = 0;
    for (std::int64_t i = 0; i < V_; ++i)
      pi_cdf_[static_cast<std::size_t>(i)] = (c += pi_[static_cast<std::size_t>(i)]);
  }

  std::int64_t vocab() const { return V_; }
  // The entropy rate in nats per token: the floor of the cross-entropy of any predictor.
  double entropy_rate() const { return entropy_; }
  const std::vector<double>& stationary_distribution() const { return pi_; }
  // P(to | from): the floor plus `to`'s share as a successor of `from`.
  double transition(std::int64_t from, std::int64_t to) const {
    double p = floor_;
    for (int s = 0; s < k_; ++s)
      if (to_[static_cast<std::size_t>(from * k_ + s)] == to) p += mass_[static_cast<std::size_t>(from * k_ + s)];
    return p;
  }

  // Sequence k, `length` tokens long.
  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t length) const {
    std::int64_t s = draw_stationary(weft::uniform(seed_, 1u << 30, k));
    for (std::int64_t t = 0; t < length; ++t) {
      out[t] = static_cast<std::int32_t>(s);
      s = step(s, weft::uniform(seed_ ^ 0x5bd1e995u, k, static_cast<std::uint64_t>(t)));
    }
  }

 private:
  static constexpr double kNoise = 0.02;  // the mass spread evenly over every token

  // The successor of `from` for u uniform in [0, 1): u below the successors' mass (0.98) picks one
  // by its share; the rest, rescaled to [0, 1), picks a token uniformly.
  std::int64_t step(std::int64_t from, double u) const {
    const double* w = mass_.data() + from * k_;
    double c = 0;
    for (int s = 0; s < k_; ++s)
      if (u < (c += w[s]) && w[s] > 0) return to_[static_cast<std::size_t>(from * k_ + s)];
    const double r = std::clamp((u - (1 - kNoise)) / kNoise, 0.0, 1.0);
    return std::min(static_cast<std::int64_t>(r * static_cast<double>(V_)), V_ - 1);
  }
  std::int64_t draw_stationary(double u) const {  // the first index with cdf > u
    const auto it = std::upper_bound(pi_cdf_.begin(), pi_cdf_.end(), u);
    return std::min(static_cast<std::int64_t>(it - pi_cdf_.begin()), V_ - 1);
  }
  // pi = pi P, by power iteration: (pi P)_j = floor x sum(pi) + sum over rows i with successor j of
  // pi_i x share; then H = sum_i pi_i H(P_i), each row's entropy from its successors and the floor.
  void stationary() {
    pi_.assign(static_cast<std::size_t>(V_), 1.0 / static_cast<double>(V_));
    std::vector<double> next(pi_.size());
    for (int it = 0; it < 10000; ++it) {
      double total = 0;
      for (double p : pi_) total += p;
      std::fill(next.begin(), next.end(), floor_ * total);
      for (std::int64_t i = 0; i < V_; ++i)
        for (int s = 0; s < k_; ++s)
          next[static_cast<std::size_t>(to_[static_cast<std::size_t>(i * k_ + s)])] +=
              pi_[static_cast<std::size_t>(i)] * mass_[static_cast<std::size_t>(i * k_ + s)];
      double diff = 0;
      for (std::size_t j = 0; j < next.size(); ++j) diff += std::fabs(next[j] - pi_[j]);
      pi_.swap(next);
      if (diff < 1e-15) break;
    }
    entropy_ = 0;
    for (std::int64_t i = 0; i < V_; ++i) {
      double h = 0;
      std::int64_t spikes = 0;
      for (int s = 0; s < k_; ++s) {
        const double w = mass_[static_cast<std::size_t>(i * k_ + s)];
        if (w == 0) continue;  // a merged repeat
        const double p = floor_ + w;
        h -= p * std::log(p);
        ++spikes;
      }
      h -= static_cast<double>(V_ - spikes) * floor_ * std::log(floor_);
      entropy_ += pi_[static_cast<std::size_t>(i)] * h;
    }
  }

  std::int64_t V_;
  std::uint64_t seed_;
  int k_;
  double floor_ = 0;
  std::vector<std::int64_t> to_;  // (V, k): each row's successors, in token order (repeats merged: share 0)
  std::vector<double> mass_;      // (V, k): each successor's share, 0.98 x its weight over the row's
  std::vector<double> pi_, pi_cdf_;
  double entropy_ = 0;
};

}  // namespace weft::data
