// Training runs that save and resume checkpoints, for the checkpoint tests: a tiny model (GPT-2 by
// default; any StagedModel, with its own config) on the Markov
// corpus under a strategy, a precision and a mesh (data x pipe x tensor thread ranks), AdamW with
// warm-up and cosine decay over `total` steps, clipping at 1.
#pragma once

#include <unistd.h>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "nn/equivalence.hpp"
#include "weft/checkpoint/checkpoint.hpp"
#include "weft/data/loader.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/optim/schedule.hpp"
#include "weft/pipeline/executor.hpp"
#include "weft/pipeline/pipelined.hpp"

namespace weft::test {

// vocab 30 is not a multiple of 4: tensor degrees 4 pad wte; heads 4 allow tensor 4; seq 16 allows SP.
inline gpt2::Config ckpt_config() { return {.vocab = 30, .seq = 16, .layers = 2, .heads = 4, .width = 32, .seed = 11}; }

inline std::string scratch(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / cat("weft_ckpt_", ::getpid(), "_", name);
  std::filesystem::remove_all(p);
  return p.string();
}

struct MeshDegrees {
  int data = 1, tensor = 1, pipe = 1, context = 1;
};

// What a run does: load from `resume` (empty: start fresh; load_optimizer false: the weights only),
// train until step `until` (steps counted from the checkpoint's), then save to `save` (empty: no save).
struct RunPlan {
  std::string resume, save;
  int until = 0, total = 20;
  bool load_optimizer = true;
  int keep = 0;
  int save_every = 0;       // also save every N steps (0: at the end only)
  bool async_save = false;  // with an asynchronous Saver, polled every step
  static RunPlan fresh(std::string save, int until) { return {"", std::move(save), until, 20, true, 0, 0, false}; }
  static RunPlan resumed(std::string from, std::string save, int until) {
    return {std::move(from), std::move(save), until, 20, true, 0, 0, false};
  }
};

// GPT-2 on the host, as ckpt_run's Model takes it.
template <class P, bool SP>
using Gpt2 = gpt2::Model<P, SP, recompute::None, Host>;

// Runs `plan` for Model<P, SP> under data strategy S on mesh `m`, saving with policy Policy;
// returns rank 0's losses of the steps it trained.
template <class P, class S, bool SP = false, class Policy = checkpoint::Sharded, template <class, bool> class M = Gpt2,
          class Config = gpt2::Config>
std::vector<double> ckpt_run(MeshDegrees m, const RunPlan& plan, const Config& c = ckpt_config(),
                             std::int64_t batch = 8) {
  std::vector<double> losses;
  std::mutex mu;
  const data::MarkovSource corpus(c.vocab, 3);
  const auto schedule = optim::Schedule::warmup_cosine(3e-3, 2, plan.total, 3e-4);
  run_threads(m.data * m.tensor * m.pipe * m.context, [&](ThreadComm& world) {
    Host dev;
    Mesh mesh{world, {.data = m.data, .pipe = m.pipe, .context = m.context, .tensor = m.tensor}};
    using Model = M<P, SP>;
    const auto part = pipeline::Partition::even(m.pipe, 1, c.layers);
    Model gpt(dev, c, mesh.spread(), batch, part.placement(mesh.coord().pipe));
    auto dp = optim::data_parallel<S>(gpt, optim::AdamW{}, mesh);
    data::Loader<data::MarkovSource> loader(corpus, c.seq, batch, m.data, mesh.coord().data);
    std::int64_t step = 0;
    if (!plan.resume.empty()) {
      const auto st = checkpoint::load(plan.resume, gpt, dp, mesh, {.optimizer = plan.load_optimizer});
      step = st.step;
      loader.seek(st.loader_position);
    }
    std::optional<pipeline::Pipeline<Model, decltype(mesh)>> pp;
    if (m.pipe > 1) pp.emplace(gpt, pipeline::make_table(pipeline::Kind::one_f_one_b, m.pipe, 1, 1), part, mesh);
    std::optional<checkpoint::Saver<Policy>> saver;
    if (!plan.save.empty()) saver.emplace(plan.save, checkpoint::SaveOptions{.keep = plan.keep}, plan.async_save);
    auto state = [&] {
      return checkpoint::RunState{.step = step, .loader_position = loader.position(), .seed = c.seed};
    };
    std::vector<std::int32_t> x, y;
    for (; step < plan.until; ++step) {
      loader.next(x, y);
      dp.zero_grad();
      double loss = 0;
      if (pp) {
        loss = pp->run(std::vector<nn::MicroBatch>{{{x, y}, batch, 1.0}}, dp);
      } else {
        auto ctx = gpt.in_flight({{x, y}, batch});
        loss = pipeline::forward_backward(gpt, ctx, mesh, dp);
      }
      dp.step(schedule.lr(step), 1.0);
      if (world.rank() == 0) {
        std::lock_guard lock(mu);
        losses.push_back(loss);
      }
      if (saver && plan.save_every > 0 && (step + 1) % plan.save_every == 0 && step + 1 < plan.until) {
        ++step;
        saver->save(gpt, dp, mesh, state());
        --step;
      } else if (saver) {
        saver->poll(mesh);
      }
    }
    if (saver) {
      saver->save(gpt, dp, mesh, state());
      saver->wait(mesh);
    }
  });
  return losses;
}

// Every tensor of two checkpoints, compared bit for bit as f64 (f32 and bf16 widen exactly);
// returns the first difference, or "" when they are equal.
inline std::string compare_checkpoints(const std::string& a, const std::string& b, bool optimizer = true) {
  const checkpoint::Reader ra(a), rb(b);
  std::size_t compared = 0;
  for (const auto& [name, t] : ra.manifest().tensors) {
    if (!optimizer && !name.starts_with("param/") && !name.starts_with("master/")) continue;
    if (!rb.has(name)) {
      if (name.starts_with("master/")) continue;  // a precision without master weights
      return cat(b, " lacks ", name);
    }
    const auto x = ra.read<double>(name), y = rb.read<double>(name);
    if (x.size() != y.size()) return cat(name, ": ", x.size(), " against ", y.size(), " elements");
    for (std::size_t i = 0; i < x.size(); ++i)
      if (std::memcmp(&x[i], &y[i], sizeof(double)) != 0) return cat(name, "[", i, "]: ", x[i], " against ", y[i]);
    ++compared;
  }
  if (compared == 0) return "no tensors compared";
  return "";
}

}  // namespace weft::test
