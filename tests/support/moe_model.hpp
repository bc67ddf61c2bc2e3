// defines: test::moe::Run, test::moe::run, test::moe::check_one_rank: one forward and backward of a mixture-of-experts
// model (mixtral::Model, qwen3_moe::Model) on a reference batch whose weights and gradients a fixture of
// tools/reference holds under weft's names (value/<name>, grad/<name>, tokens, targets), on data x
// tensor ranks (SP where the model says) with an expert degree: the loss, the logits (one rank),
// each sparse layer's router losses and the worst gradient's relative difference from the fixture's.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "support/error.hpp"
#include "weft/checkpoint/import_dir.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/redistribute.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/nn/layer_walk.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/executor.hpp"

namespace weft::test::moe {

// max |a - b| / max |b|, infinite on NaN or a size that differs.
inline double relative(const std::vector<double>& a, const std::vector<double>& b) { return test::rel_error(a, b); }

struct Run {
  double loss = 0;
  std::vector<double> logits, aux, z;  // logits on one rank only
  double worst = 0;                    // the worst gradient's relative difference
  std::string where;
};

// One forward and backward of the reference batch on data x tensor (SP where tensor > 1) ranks
// with an expert degree, its weights the reference's; gradients reduced by DDP and gathered.
template <class Model, class Config>
Run run(const Config& c, const checkpoint::ImportDir& ref, int data, int tensor, int expert) {
  const auto tokens = ref.read("tokens"), targets = ref.read("targets");
  const std::int64_t B = static_cast<std::int64_t>(tokens.size()) / c.seq;
  Run out;
  std::mutex mu;
  run_threads(data * tensor, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {.data = data, .tensor = tensor, .expert = expert}};
    Model model(h, c, mesh.spread(), B);
    auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{}, mesh);
    model.for_each_param([&](const std::string& name, auto& p) {
      const auto g = ref.read("value/" + name);
      for (std::int64_t i = 0; i < p.value.numel(); ++i)
        p.value.data()[i] = g[static_cast<std::size_t>(p.value.global_index(i))];
    });
    const std::int64_t Bl = B / data, first = mesh.coord().data * Bl * c.seq;
    std::vector<std::int32_t> x(static_cast<std::size_t>(Bl * c.seq)), y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<std::int32_t>(tokens[static_cast<std::size_t>(first) + i]);
      y[i] = static_cast<std::int32_t>(targets[static_cast<std::size_t>(first) + i]);
    }
    auto ctx = model.in_flight({{x, y}, B});
    pipeline::forward(model, ctx, mesh, dp);
    std::vector<double> logits;
    if (data * tensor == 1) logits = ctx.head.ce.logits.to_host();
    pipeline::backward(model, ctx, mesh, dp, true);
    std::vector<double> aux, z;
    for (auto& block : model.blocks)
      nn::for_each_layer(block, [&](auto& leaf) {
        if constexpr (nn::Routes<std::remove_cvref_t<decltype(leaf)>>)
          aux.push_back(leaf.last_aux), z.push_back(leaf.last_z);
      });
    double worst = 0;
    std::string where;
    model.for_each_param([&](const std::string& name, auto& p) {
      const auto t = redistribute<Replicated>(p.grad, mesh);
      const double e = relative(std::vector<double>(t.data(), t.data() + t.numel()), ref.read("grad/" + name));
      if (e > worst || std::isnan(e)) worst = test::worse(worst, e), where = name;
    });
    if (world.rank() != 0) return;
    std::lock_guard lock(mu);
    out = {ctx.loss, logits, aux, z, worst, where};
  });
  return out;
}

// One rank's run against the fixture it ran: the logits, the cross-entropy and every gradient
// within 1e-10, each sparse layer's router losses within 1e-12 (the same products summed in other
// orders: about 1e-15 printed). Returns the logits' error.
inline double check_one_rank(const Run& one, const checkpoint::ImportDir& ref) {
  const double loss = ref.read("loss")[0];
  const double el = relative(one.logits, ref.read("logits"));
  CHECK(el <= 1e-10);
  CHECK(std::abs(one.loss - loss) <= 1e-10 * loss);
  CHECK(relative(one.aux, ref.read("aux")) <= 1e-12);
  CHECK(relative(one.z, ref.read("z")) <= 1e-12);
  CHECK_MESSAGE(one.worst <= 1e-10, "worst gradient: ", one.where);
  return el;
}

}  // namespace weft::test::moe
