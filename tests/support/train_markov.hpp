// Training runs on the Markov corpus for tests that compare precisions, strategies and devices:
// `steps` AdamW steps (warm-up then cosine, clipping at 1), data x tensor thread ranks, each rank on
// the device rank_device<D> gives it (nn/equivalence.hpp); returns rank 0's training losses.
#pragma once

#include <mutex>
#include <vector>

#include "nn/equivalence.hpp"
#include "weft/data/loader.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/optim/schedule.hpp"
#include "weft/pipeline/executor.hpp"

namespace weft::test {

inline gpt2::Config markov_config() {
  return {.vocab = 32, .seq = 16, .layers = 2, .heads = 2, .width = 32, .seed = 5};
}

template <class P, class Strategy = optim::Ddp, bool SP = false, class D = Host>
std::vector<double> train_markov(int steps, int data, int tensor = 1, const gpt2::Config& c = markov_config(),
                                 std::int64_t batch = 8) {
  std::vector<double> losses;
  std::mutex mu;
  const data::MarkovSource corpus(c.vocab, 3);
  const auto schedule = optim::Schedule::warmup_cosine(3e-3, steps / 20, steps, 3e-4);
  run_threads(data * tensor, [&](ThreadComm& world) {
    auto dev = rank_device<D>(world);
    Mesh mesh{world, {.data = data, .tensor = tensor}};
    gpt2::Model<P, SP, recompute::None, D> gpt(*dev, c, mesh.spread(), batch);
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{}, mesh);
    data::Loader<data::MarkovSource> loader(corpus, c.seq, batch, data, mesh.coord().data);
    std::vector<std::int32_t> x, y;
    for (int step = 0; step < steps; ++step) {
      loader.next(x, y);
      dp.zero_grad();
      auto ctx = gpt.in_flight({{x, y}, batch});
      const double loss = pipeline::forward_backward(gpt, ctx, mesh, dp);
      dp.step(schedule.lr(step), 1.0);
      if (world.rank() == 0) {
        std::lock_guard lock(mu);
        losses.push_back(loss);
      }
    }
  });
  return losses;
}

inline double mean_of_last(const std::vector<double>& v, std::size_t n) {
  double s = 0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

}  // namespace weft::test
