// The synthetic Markov corpus: a proper chain, its exact entropy rate, and sampling that matches it.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "weft/data/loader.hpp"
#include "weft/data/synthetic.hpp"

using namespace weft;
using namespace weft::data;

TEST_CASE("the Markov source is a stochastic matrix with its stationary distribution") {
  const MarkovSource m(64, 7);
  for (std::int64_t i = 0; i < 64; ++i) {
    double row = 0;
    for (std::int64_t j = 0; j < 64; ++j) row += m.transition(i, j);
    CHECK(row == doctest::Approx(1.0).epsilon(1e-12));
  }
  const auto& pi = m.stationary_distribution();
  for (std::int64_t j = 0; j < 64; ++j) {
    double next = 0;
    for (std::int64_t i = 0; i < 64; ++i) next += pi[static_cast<std::size_t>(i)] * m.transition(i, j);
    CHECK(next == doctest::Approx(pi[static_cast<std::size_t>(j)]).epsilon(1e-10));
  }
  // Between a deterministic chain (0) and uniform noise (log 64 = 4.16).
  CHECK(m.entropy_rate() > 0.5);
  CHECK(m.entropy_rate() < std::log(64.0) - 1.0);
}

TEST_CASE("sampled sequences have the computed entropy rate") {
  // The mean of -log P(x_t+1 | x_t) over 2000 sequences of 101 tokens estimates the entropy rate;
  // the per-token values have a standard deviation below 2, so the standard error is below 0.0015
  // (correlations aside): 0.02 is over 10 of them. Seed 7, and seed 1: the trainer's corpus for the
  // 64-token presets, whose rate tests/examples/weft_train_llama.py takes as its floor (1.04309).
  CHECK(MarkovSource(64, 1).entropy_rate() == doctest::Approx(1.04309).epsilon(1e-5));
  for (std::uint64_t seed : {7, 1}) {
    const MarkovSource m(64, seed);
    std::vector<std::int32_t> s(101);
    double total = 0;
    std::int64_t count = 0;
    for (std::uint64_t k = 0; k < 2000; ++k) {
      m.sequence(k, s.data(), 101);
      for (std::size_t t = 0; t + 1 < s.size(); ++t, ++count) total -= std::log(m.transition(s[t], s[t + 1]));
    }
    CHECK(total / static_cast<double>(count) == doctest::Approx(m.entropy_rate()).epsilon(0.02 / m.entropy_rate()));
    MESSAGE("seed ", seed, ": entropy rate ", m.entropy_rate(), " nats; empirical ",
            total / static_cast<double>(count));
  }
}

TEST_CASE("GPT-2's and Llama 3's vocabularies: rows that sum to 1, and samples with the computed entropy rate") {
  // The source keeps a few successors per row over a uniform floor, so these build in O(V) (a dense
  // V x V table took 40 GB at V = 50257 and hung benchmarks/gpt2.cu). As above: 2000 sequences of
  // 101 tokens, 0.02 nats is over 10 standard errors; a row's sum is V terms near 1 / V and a few
  // spikes, exact to 1e-12.
  for (std::int64_t V : {50257, 128256}) {
    const MarkovSource m(V, 1);
    for (std::int64_t i : {std::int64_t{0}, V / 3, V - 1}) {
      double row = 0;
      for (std::int64_t j = 0; j < V; ++j) row += m.transition(i, j);
      CHECK_MESSAGE(std::abs(row - 1.0) <= 1e-12, "V ", V, " row ", i, " sums to ", row);
    }
    std::vector<std::int32_t> s(101);
    double total = 0;
    std::int64_t count = 0, off = 0;
    for (std::uint64_t k = 0; k < 2000; ++k) {
      m.sequence(k, s.data(), 101);
      for (std::size_t t = 0; t + 1 < s.size(); ++t, ++count) {
        const double p = m.transition(s[t], s[t + 1]);
        total -= std::log(p);
        off += p < 2.0 / static_cast<double>(V);  // a draw from the floor, not a successor
      }
    }
    MESSAGE("V ", V, ": entropy rate ", m.entropy_rate(), " nats; empirical ", total / static_cast<double>(count));
    CHECK(total / static_cast<double>(count) == doctest::Approx(m.entropy_rate()).epsilon(0.02 / m.entropy_rate()));
    // The floor's share of draws is 0.02 (less the few that land on a successor): 200000 draws, so
    // the standard error of that share is 3e-4; 0.004 is over 10 of them.
    CHECK(std::abs(static_cast<double>(off) / static_cast<double>(count) - 0.02) < 0.004);
  }
  CHECK_THROWS_WITH_AS(MarkovSource((std::int64_t{1} << 24) + 1, 1), doctest::Contains("vocabulary of 16777217 tokens"),
                       Error);
}

TEST_CASE("the loader gives the same global batch for every data degree and restores its position") {
  const MarkovSource m(32, 3);
  const std::int64_t T = 8, B = 8;
  auto global = [&](int dp, std::int64_t step) {
    std::vector<std::int32_t> all, tok, tgt;
    for (int d = 0; d < dp; ++d) {
      Loader<MarkovSource> l(m, T, B, dp, d);
      l.seek(step);
      l.next(tok, tgt);
      CHECK(tok.size() == static_cast<std::size_t>(B / dp * T));
      for (std::size_t i = 0; i + 1 < tok.size(); ++i)
        if ((i + 1) % T != 0) CHECK(tgt[i] == tok[i + 1]);  // targets are the next tokens
      all.insert(all.end(), tok.begin(), tok.end());
    }
    return all;
  };
  for (std::int64_t step : {0, 1, 5}) {
    const auto one = global(1, step);
    CHECK(global(2, step) == one);
    CHECK(global(4, step) == one);
    CHECK(global(8, step) == one);
  }
  Loader<MarkovSource> l(m, T, B, 1, 0);
  std::vector<std::int32_t> a, b, t;
  l.next(a, t);
  l.next(a, t);
  const auto pos = l.position();
  l.next(a, t);
  l.seek(pos);
  l.next(b, t);
  CHECK(a == b);
  CHECK_THROWS_WITH_AS(Loader<MarkovSource>(m, T, 6, 4, 0), doctest::Contains("global batch 6, data rank 0 of 4"),
                       Error);
  // A position whose sequence indices (step x batch) overflow 63 bits is refused; the last one that
  // fits reads (under UBSan an overflow would end the test).
  const std::int64_t most = std::numeric_limits<std::int64_t>::max() / B - 1;
  CHECK_THROWS_WITH_AS(l.seek(most + 1), doctest::Contains(cat("use a step in [0, ", most, "]").c_str()), Error);
  CHECK_THROWS_WITH_AS(l.seek(-1), doctest::Contains("step -1 with a global batch of 8"), Error);
  l.seek(most);
  l.next(a, t);
  CHECK(a.size() == static_cast<std::size_t>(B * T));
}
