// Mixtral with its experts split over tensor (expert-tensor parallelism, nn::ExpertTensor::sharded:
// nn/moe.hpp) through the optimizer and checkpoints: 3 AdamW steps on data 2 x tensor 2 x expert 2
// with SP under ZeRO-1, and on data 4 x tensor 2 x expert 2 under FSDP, give one rank's (whole
// experts, DDP) losses and parameters within 1e-12 in f64 (the same products summed in other
// orders); the ZeRO-1 run's checkpoint loads on one rank with whole experts and is saved again bit
// for bit (parameters and AdamW's moments), and one rank's loads on the split layout the same way.
#include <doctest/doctest.h>

#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "support/checkpoints.hpp"
#include "support/error.hpp"
#include "weft/checkpoint/checkpoint.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/mixtral/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/executor.hpp"

using namespace weft;

namespace expert_tensor {

constexpr std::int64_t kBatch = 4;
using nn::ExpertTensor::sharded;
using Whole = mixtral::Model<double>;
using SplitSp = mixtral::Model<double, true, recompute::None, Host, nn::AllToAllDispatch, context::None, sharded>;
using Split = mixtral::Model<double, false, recompute::None, Host, nn::AllToAllDispatch, context::None, sharded>;

mixtral::Config tiny() {
  mixtral::Config c;
  c.vocab = 32, c.seq = 8, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.width = 16, c.hidden = 8;
  c.rope = {.theta = 10000.0}, c.norm_eps = 1e-5, c.seed = 3, c.init_std = 0.3;
  c.experts = 4, c.top_k = 2, c.aux_coef = 0.02, c.z_coef = 0.001;
  return c;
}

std::string scratch(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / cat("weft_expert_tensor_", ::getpid(), "_", name);
  std::filesystem::remove_all(p);
  return p.string();
}

// From `resume` (or fresh) to step `until` on data x tensor ranks with an expert degree under
// strategy S, saving to `save`: each step's loss.
template <class Model, class S>
std::vector<double> train(int data, int tensor, int expert, const std::string& resume, const std::string& save,
                          int until) {
  const mixtral::Config c = tiny();
  std::vector<double> out;
  std::mutex mu;
  run_threads(data * tensor, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {.data = data, .tensor = tensor, .expert = expert}};
    Model model(h, c, mesh.spread(), kBatch);
    auto dp = optim::data_parallel<S>(model, optim::AdamW{.config = {.lr = 1e-2}}, mesh);
    std::int64_t step = 0;
    if (!resume.empty()) step = checkpoint::load(resume, model, dp, mesh).step;
    std::vector<double> losses;
    for (; step < until; ++step) {
      const std::int64_t local = kBatch / data, first = mesh.coord().data * local;
      std::vector<std::int32_t> x, y;
      for (std::int64_t i = first * c.seq; i < (first + local) * c.seq; ++i) {  // the same tokens on every mesh
        const auto key = static_cast<std::uint64_t>(step * 1000 + i);
        x.push_back(static_cast<std::int32_t>((key * 2654435761ull + 7) % static_cast<std::uint64_t>(c.vocab)));
        y.push_back(static_cast<std::int32_t>((key * 40503ull + 11) % static_cast<std::uint64_t>(c.vocab)));
      }
      dp.zero_grad();
      auto ctx = model.in_flight({{x, y}, kBatch});
      losses.push_back(pipeline::forward_backward(model, ctx, mesh, dp));
      dp.step(1e-2, 1.0);
    }
    checkpoint::Saver<checkpoint::Sharded> saver(save, {});
    saver.save(model, dp, mesh, {.step = step});
    saver.wait(mesh);
    if (world.rank() != 0) return;
    std::lock_guard lock(mu);
    out = losses;
  });
  return out;
}

// The largest relative difference of two checkpoints' parameters, and where.
std::pair<double, std::string> worst(const std::string& a, const std::string& b) {
  const checkpoint::Reader ra(a), rb(b);
  double w = 0;
  std::string where = "none compared";
  for (const auto& [name, t] : rb.manifest().tensors) {
    if (!name.starts_with("param/")) continue;
    const double e = ra.has(name) ? test::rel_error(ra.read<double>(name), rb.read<double>(name)) : INFINITY;
    if (e > w || std::isnan(e) || where == "none compared") w = test::worse(w, e), where = name;
  }
  return {w, where};
}

}  // namespace expert_tensor

TEST_CASE("Mixtral with its experts split over tensor trains and checkpoints as one rank with whole experts") {
  using namespace expert_tensor;
  const std::string zero1 = scratch("zero1"), fsdp = scratch("fsdp"), one_ck = scratch("one"), back = scratch("back"),
                    there = scratch("there");
  const auto one = train<Whole, optim::Ddp>(1, 1, 1, "", one_ck, 3);
  const auto z1 = train<SplitSp, optim::Zero1>(2, 2, 2, "", zero1, 3);
  const auto fs = train<Split, optim::Fsdp>(4, 2, 2, "", fsdp, 3);
  REQUIRE(one.size() == 3);
  for (const auto& [losses, ck, name] :
       {std::tuple{&z1, zero1, std::string("data 2 x tensor 2 x expert 2, SP, ZeRO-1")},
        std::tuple{&fs, fsdp, std::string("data 4 x tensor 2 x expert 2, FSDP")}}) {
    INFO(name);
    REQUIRE(losses->size() == 3);
    for (std::size_t s = 0; s < 3; ++s) CHECK(std::abs((*losses)[s] - one[s]) <= 1e-12 * one[s]);
    const auto [w, where] = worst(ck, one_ck);
    CHECK_MESSAGE(w <= 1e-12, "worst parameter: ", where);
    MESSAGE(name, ": losses ", (*losses)[0], ", ", (*losses)[1], ", ", (*losses)[2], " (one rank's last ", one[2],
            "); parameters after 3 AdamW steps within ", w, " (", where, ")");
  }
  // The split layout's checkpoint on one rank with whole experts, saved again: bit for bit; and
  // one rank's on the split layout (ZeRO-1, SP) the same way.
  train<Whole, optim::Ddp>(1, 1, 1, zero1, back, 3);
  CHECK(test::same_checkpoints(zero1, back) == "");
  train<SplitSp, optim::Zero1>(2, 2, 2, one_ck, there, 3);
  CHECK(test::same_checkpoints(one_ck, there) == "");
  const checkpoint::Reader r(zero1);
  CHECK(r.has("param/layers.0.mlp.experts.gate_up"));
  for (const auto& d : {zero1, fsdp, one_ck, back, there}) std::filesystem::remove_all(d);
}
