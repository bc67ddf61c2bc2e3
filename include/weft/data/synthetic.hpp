// A built-in synthetic corpus whose entropy is known: a seeded first-order Markov source over V
// tokens. Each row of the transition matrix puts its mass on a few successors (weights from Philox,
// sharpened), so a small model can learn it; the entropy rate
//   H = sum_i pi_i H(P_i)          (pi the stationary distribution)
// is computed exactly (power iteration in double), and a trained model's loss on fresh sequences
// cannot go below it: the trainer reports its loss next to this floor.
//
// Sequences are random access: sequence k starts from a state drawn from pi and takes its steps
// from Philox keyed by (seed, k), so batch contents do not depend on who reads them or in what
// order.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/philox.hpp"

namespace weft::data {

class MarkovSource {
 public:
  MarkovSource(std::int64_t vocab, std::uint64_t seed, int successors = 4) : V_(vocab), seed_(seed) {
    if (vocab < 2 || vocab > 65536)
      throw Error("MarkovSource", cat("vocabulary of ", vocab, " tokens"), "use 2 to 65536 tokens");
    if (successors < 1 || successors > vocab)
      throw Error("MarkovSource", cat(successors, " successors for ", vocab, " tokens"), "use 1 to vocab successors");
    P_.assign(static_cast<std::size_t>(V_ * V_), 0.0);
    for (std::int64_t i = 0; i < V_; ++i) {
      double total = 0;
      for (int s = 0; s < successors; ++s) {
        const auto j = static_cast<std::int64_t>(philox(seed, 1000 + static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(s))[0] % static_cast<std::uint64_t>(V_));
        const double w = std::exp(1.5 * weft::normal(seed, 2000 + static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(s)));
        P_[static_cast<std::size_t>(i * V_ + j)] += w;
        total += w;
      }
      for (std::int64_t j = 0; j < V_; ++j) {  // a little mass everywhere keeps the chain ergodic
        double& p = P_[static_cast<std::size_t>(i * V_ + j)];
        p = 0.98 * p / total + 0.02 / static_cast<double>(V_);
      }
    }
    stationary();
    cdf_.resize(P_.size());
    for (std::int64_t i = 0; i < V_; ++i) {
      double c = 0;
      for (std::int64_t j = 0; j < V_; ++j) cdf_[static_cast<std::size_t>(i * V_ + j)] = (c += P_[static_cast<std::size_t>(i * V_ + j)]);
    }
    pi_cdf_.resize(static_cast<std::size_t>(V_));
    double c = 0;
    for (std::int64_t i = 0; i < V_; ++i) pi_cdf_[static_cast<std::size_t>(i)] = (c += pi_[static_cast<std::size_t>(i)]);
  }

  std::int64_t vocab() const { return V_; }
  // The entropy rate in nats per token: the floor of the cross-entropy of any predictor.
  double entropy_rate() const { return entropy_; }
  const std::vector<double>& stationary_distribution() const { return pi_; }
  double transition(std::int64_t from, std::int64_t to) const { return P_[static_cast<std::size_t>(from * V_ + to)]; }

  // Sequence k, `length` tokens long.
  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t length) const {
    std::int64_t s = draw(pi_cdf_.data(), weft::uniform(seed_, 1u << 30, k));
    for (std::int64_t t = 0; t < length; ++t) {
      out[t] = static_cast<std::int32_t>(s);
      s = draw(cdf_.data() + s * V_, weft::uniform(seed_ ^ 0x5bd1e995u, k, static_cast<std::uint64_t>(t)));
    }
  }

 private:
  std::int64_t draw(const double* cdf, double u) const {
    std::int64_t lo = 0, hi = V_ - 1;  // first index with cdf > u
    while (lo < hi) {
      const std::int64_t mid = (lo + hi) / 2;
      if (cdf[mid] > u) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }
  void stationary() {
    pi_.assign(static_cast<std::size_t>(V_), 1.0 / static_cast<double>(V_));
    std::vector<double> next(pi_.size());
    for (int it = 0; it < 10000; ++it) {
      std::fill(next.begin(), next.end(), 0.0);
      for (std::int64_t i = 0; i < V_; ++i)
        for (std::int64_t j = 0; j < V_; ++j)
          next[static_cast<std::size_t>(j)] += pi_[static_cast<std::size_t>(i)] * P_[static_cast<std::size_t>(i * V_ + j)];
      double diff = 0;
      for (std::size_t j = 0; j < next.size(); ++j) diff += std::fabs(next[j] - pi_[j]);
      pi_.swap(next);
      if (diff < 1e-15) break;
    }
    entropy_ = 0;
    for (std::int64_t i = 0; i < V_; ++i)
      for (std::int64_t j = 0; j < V_; ++j) {
        const double p = P_[static_cast<std::size_t>(i * V_ + j)];
        if (p > 0) entropy_ -= pi_[static_cast<std::size_t>(i)] * p * std::log(p);
      }
  }

  std::int64_t V_;
  std::uint64_t seed_;
  std::vector<double> P_, cdf_, pi_, pi_cdf_;
  double entropy_ = 0;
};

}  // namespace weft::data
