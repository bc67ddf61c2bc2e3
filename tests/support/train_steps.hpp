// A few optimizer steps of any staged model on a mesh (data x pipe x context x tensor thread ranks,
// an expert degree carved from data x context; every context rank of a data rank reads the same
// samples), fed by a batch source (TokenBatches,
// a Markov corpus's sequences, by default; any model's inputs with another), with
// the loss of each step, every global gradient after the first (DDP only: other strategies keep
// slices) and every global parameter after the last, gathered on the calling thread; pipe 1 runs
// the same micro-batches one after another through the plain executor (the reference). A language
// model's vocabulary tables ("wte", "lm_head") are cut to the real vocabulary's rows.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "support/gradcheck.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/data/loader.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/pipelined.hpp"

namespace weft::test {

struct StepsRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> grads, values;  // after the first step (DDP); after the last
};

// A language model's batches: a data rank's sequences of a Markov corpus (data::Loader), the same
// on every rank of the data rank. next() gives one micro-batch of the global `micro`, owning its
// storage until the next call for the same index.
template <class Model>
struct TokenBatches {
  data::MarkovSource corpus;
  data::Loader<data::MarkovSource> loader;
  std::int64_t micro;
  std::vector<std::vector<std::int32_t>> x, y;
  TokenBatches(const typename Model::config_type& c, std::int64_t micro_batch, int data, int data_rank, int m)
      : corpus(c.vocab, 5),
        loader(corpus, c.seq, micro_batch, data, data_rank),
        micro(micro_batch),
        x(static_cast<std::size_t>(m)),
        y(static_cast<std::size_t>(m)) {}
  typename Model::MicroBatch next(int, int i, double scale) {
    loader.next(x[static_cast<std::size_t>(i)], y[static_cast<std::size_t>(i)]);
    return {{x[static_cast<std::size_t>(i)], y[static_cast<std::size_t>(i)]}, micro, scale};
  }
};

// `steps` steps of AdamW (lr 1e-2) with clipping at 1 over m micro-batches of `micro` samples from
// Batches, under schedule Sched on a pipe of `pipe` ranks with v virtual stages each.
template <class Model, class Sched, class Strategy = optim::Ddp, class Batches = TokenBatches<Model>>
StepsRun train_steps(const typename Model::config_type& c, std::int64_t micro, int m, int pipe, int v, int tensor,
                     int data, int steps, int context = 1, int expert = 1) {
  StepsRun out;
  std::mutex mu;
  run_threads(pipe * tensor * data * context, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {.data = data, .pipe = pipe, .context = context, .tensor = tensor, .expert = expert}};
    const pipeline::Partition part = pipeline::Partition::even(pipe, v, c.layers);
    Model model(h, c, mesh.spread(), micro, part.placement(mesh.coord().pipe));
    auto dp = optim::data_parallel<Strategy>(model, optim::AdamW{.config = {.lr = 1e-2}}, mesh);
    std::optional<pipeline::Pipeline<Model, decltype(mesh)>> pp;
    if (pipe > 1) pp.emplace(model, pipeline::table<Sched>(pipe, m, v), part, mesh);
    Batches batches(c, micro, data, mesh.coord().data, m);
    const bool lead = mesh.coord().tensor == 0 && mesh.coord().data == 0 && mesh.coord().context == 0;
    auto gather = [&](std::map<std::string, std::vector<double>>& into, bool grads) {
      model.for_each_param([&](const std::string& name, auto& p) {
        std::vector<double> g;
        if (grads) {
          const auto t = redistribute<Replicated>(p.grad, mesh);
          for (std::int64_t i = 0; i < t.numel(); ++i) g.push_back(static_cast<double>(widen(t.data()[i])));
        } else {
          const auto t = redistribute<Replicated>(p.value, mesh);
          for (std::int64_t i = 0; i < t.numel(); ++i) g.push_back(static_cast<double>(widen(t.data()[i])));
        }
        if (!lead) return;
        if constexpr (requires { c.vocab; })
          if (name == "wte" || name == "lm_head") g.resize(static_cast<std::size_t>(c.vocab * c.width));
        std::lock_guard lock(mu);
        into[name] = g;
      });
    };
    for (int step = 0; step < steps; ++step) {
      dp.zero_grad();
      std::vector<typename Model::MicroBatch> mbs;
      for (int i = 0; i < m; ++i) mbs.push_back(batches.next(step, i, 1.0 / m));
      double loss = 0;
      if (pp) {
        loss = pp->run(mbs, dp);
      } else {
        for (int i = 0; i < m; ++i) {
          auto ctx = model.in_flight(mbs[static_cast<std::size_t>(i)]);
          loss += pipeline::forward_backward(model, ctx, mesh, dp, i + 1 == m) / m;
        }
      }
      if (step == 0) {
        dp.gather_values();
        // Gradients as the step sees them (DDP keeps them whole; reduced over data and the tied pair).
        if constexpr (std::same_as<Strategy, optim::Ddp>) gather(out.grads, true);
      }
      dp.step(1e-2, 1.0);
      if (world.rank() == 0) {
        std::lock_guard lock(mu);
        out.losses.push_back(loss);
      }
    }
    dp.gather_values();
    gather(out.values, false);
  });
  return out;
}

// The worst per-tensor error (max |difference| over max |reference| of each tensor), naming it.
inline double worst_tensor(const std::map<std::string, std::vector<double>>& a,
                           const std::map<std::string, std::vector<double>>& ref, std::string& where) {
  if (a.size() != ref.size()) {
    where = cat(a.size(), " parameters against ", ref.size());
    return 1e300;
  }
  double w = 0;
  for (const auto& [name, r] : ref) {
    const auto it = a.find(name);
    if (it == a.end() || it->second.size() != r.size()) {
      where = name + " missing or of another size";
      return 1e300;
    }
    if (const double e = rel_error(it->second, r); e > w) {
      w = e;
      where = name;
    }
  }
  return w;
}

}  // namespace weft::test
