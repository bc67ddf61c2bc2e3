// Checkpoints of a model whose experts are sharded over the expert axis (the test feature model
// with a mixture of experts in every block, tests/nn/feature_spec.hpp): saved under one expert
// degree, loaded under another, every element where its layout says it lies.
//
// expert 4 (data 4, DDP) -> expert 2 x expert-data 2 (data 4, FSDP) -> one rank (DDP) -> expert 4:
// each checkpoint equals the first bit for bit (parameters and AdamW's moments), and one more step
// from the first gives the same loss on one rank and on expert 4 (1e-12 in f64: the sums in other
// orders).
#include <doctest/doctest.h>

#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "nn/feature_spec.hpp"
#include "support/checkpoints.hpp"
#include "support/gradcheck.hpp"
#include "weft/checkpoint/checkpoint.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/executor.hpp"

using namespace weft;

namespace experts_checkpoint {

using Config = test::feature::Config;
using Features = test::feature::FeaturesOf<double>;
using Model = nn::StagedModel<test::feature::Spec<false, context::None, Features, double, Host, true>>;
constexpr std::int64_t kBatch = 4;

std::string scratch(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / cat("weft_experts_", ::getpid(), "_", name);
  std::filesystem::remove_all(p);
  return p.string();
}

// Trains from `resume` (or fresh) until step `until` on data x expert thread ranks under strategy
// S and saves to `save` (where given); returns the losses of the steps it trained.
template <class S>
std::vector<double> run(int data, int expert, const std::string& resume, const std::string& save, int until) {
  const Config c{};
  std::vector<double> losses;
  std::mutex mu;
  run_threads(data, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {.data = data, .expert = expert}};
    Model model(h, c, mesh.spread(), kBatch);
    auto dp = optim::data_parallel<S>(model, optim::AdamW{.config = {.lr = 1e-2}}, mesh);
    std::int64_t step = 0;
    if (!resume.empty()) step = checkpoint::load(resume, model, dp, mesh).step;
    std::vector<double> x, y;
    for (; step < until; ++step) {
      const std::int64_t local = kBatch / data, first = mesh.coord().data * local;
      x.clear();
      y.clear();
      for (std::int64_t b = first; b < first + local; ++b) {
        const auto key = static_cast<std::uint64_t>(step * 1000 + b);
        const auto xb = test::normals(static_cast<std::size_t>(c.seq * c.in), 100 + key);
        const auto yb = test::normals(static_cast<std::size_t>(c.seq * c.out), 5000 + key);
        x.insert(x.end(), xb.begin(), xb.end());
        y.insert(y.end(), yb.begin(), yb.end());
      }
      dp.zero_grad();
      auto ctx = model.in_flight(nn::Batch<Features>{{x, y}, kBatch, 1.0});
      const double loss = pipeline::forward_backward(model, ctx, mesh, dp);
      dp.step(1e-2, 1.0);
      if (world.rank() == 0) {
        std::lock_guard lock(mu);
        losses.push_back(loss);
      }
    }
    if (!save.empty()) {
      checkpoint::Saver<checkpoint::Sharded> saver(save, {});
      saver.save(model, dp, mesh, {.step = step});
      saver.wait(mesh);
    }
  });
  return losses;
}

}  // namespace experts_checkpoint

TEST_CASE("an MoE model's checkpoint reshards across expert degrees: expert 4 -> expert 2 x data 2 -> one rank") {
  using namespace experts_checkpoint;
  const std::string c1 = scratch("1"), c2 = scratch("2"), c3 = scratch("3"), c4 = scratch("4");
  run<optim::Ddp>(4, 4, "", c1, 2);
  run<optim::Fsdp>(4, 2, c1, c2, 2);
  run<optim::Ddp>(1, 1, c2, c3, 2);
  run<optim::Ddp>(4, 4, c3, c4, 2);
  CHECK(test::same_checkpoints(c1, c2) == "");
  CHECK(test::same_checkpoints(c1, c3) == "");
  CHECK(test::same_checkpoints(c1, c4) == "");
  // The experts are in it under their layer's names.
  const checkpoint::Reader r(c1);
  CHECK(r.has("param/h0.moe.experts.gate_up"));
  const auto one = run<optim::Ddp>(1, 1, c1, "", 3), four = run<optim::Ddp>(4, 4, c1, "", 3);
  REQUIRE(one.size() == 1);
  REQUIRE(four.size() == 1);
  CHECK(std::abs(one[0] - four[0]) <= 1e-12 * std::abs(one[0]));
  MESSAGE("step 3 from the expert-4 checkpoint: loss ", one[0], " on one rank, ", four[0], " on expert 4");
  for (const auto& d : {c1, c2, c3, c4}) std::filesystem::remove_all(d);
}
