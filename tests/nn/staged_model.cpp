// nn::StagedModel with a Spec written outside weft's model: GPT-2's parts with an untied LM head (its
// own table, as Llama's), declared in a dozen lines below. Through the same executor, Pipeline and
// data-parallel protocol as gpt2::Model, with no code of weft's edited: one step's loss and every
// gradient, and 3 AdamW steps, at tensor 2 (with and without SP), pipe 2 under 1F1B and ZB-H1, and
// data 2 under each strategy, equal one rank within 1e-12 relative in double. The untied table's
// weight decay, its logical rows, and the record are the Spec's.
#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <optional>

#include "support/gradcheck.hpp"
#include "support/train_steps.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/data/loader.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/pipelined.hpp"

using namespace weft;
using namespace weft::pipeline;

namespace {

// The user's model: GPT-2's embedding and blocks, an untied head (parameter id 2 for its table).
template <class P, bool SP>
struct UntiedSpec : gpt2::Spec<P, SP> {
  using Base = gpt2::Spec<P, SP>;
  using T = typename Base::T;
  using Head = nn::HeadStage<T, SP>;
  static std::string name() { return "UntiedGpt"; }
  static Head make_head(Host& dev, const gpt2::Config& c, const Spread& s) {
    return Head(dev, c.vocab, nn::padded_vocab(c.vocab, s.tensor_degree), c.width, s, c.seed, 8, 2, c.init_std);
  }
  static void finish(nn::Unit<T, Host>& u, const gpt2::Config& c) {
    Base::finish(u, c);
    u.set_logical("lm_head", {c.vocab, c.width});  // the padded vocabulary's rows
  }
};
template <class P, bool SP = false>
using Untied = nn::StagedModel<UntiedSpec<P, SP>>;
static_assert(!Untied<double>::tied && gpt2::Model<double>::tied);

// 4 layers; vocabulary 33 (padded under tensor 2).
const gpt2::Config kConfig{.vocab = 33, .seq = 8, .layers = 4, .heads = 2, .width = 16, .seed = 3, .init_std = 0.1};
constexpr std::int64_t kMicro = 4;  // global micro-batch (sequences)
constexpr int kM = 4;               // micro-batches per step

using Run = test::StepsRun;

// `steps` AdamW steps over kM micro-batches each (support/train_steps.hpp).
template <class Model, class Sched, class Strategy = optim::Ddp>
Run run(int pipe, int tensor, int data, int steps) {
  return test::train_steps<Model, Sched, Strategy>(kConfig, kMicro, kM, pipe, 1, tensor, data, steps);
}

// The global parameter vector's error: max |difference| over max |parameter| (the attention's key
// biases, whose exact gradient is zero, make a per-tensor measure meaningless after Adam steps; see
// tests/pipeline/equivalence.cpp).
double worst_values(const Run& got, const Run& ref) {
  double diff = 0, scale = 0;
  for (const auto& [name, v] : ref.values)
    for (std::size_t i = 0; i < v.size(); ++i) {
      diff = test::worse(diff, std::fabs(got.values.at(name).at(i) - v[i]));
      scale = std::max(scale, std::fabs(v[i]));
    }
  return diff / scale;
}

template <class Model, class Sched, class Strategy = optim::Ddp>
void compare(const Run& ref, int pipe, int tensor, int data, const std::string& what) {
  const Run got = run<Model, Sched, Strategy>(pipe, tensor, data, 3);
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    CHECK_MESSAGE(std::abs(got.losses[i] - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]), what, " step ", i);
  std::string where;
  if (std::same_as<Strategy, optim::Ddp>) {
    const double e = test::worst_tensor(got.grads, ref.grads, where);
    CHECK_MESSAGE(e <= 1e-12, what, ": gradient of ", where, " off by ", e);
    MESSAGE(what, ": worst gradient error ", e, " (", where, ")");
  }
  REQUIRE(got.values.size() == ref.values.size());
  const double v = worst_values(got, ref);
  CHECK_MESSAGE(v <= 1e-12, what, ": parameters after 3 steps off by ", v);
  MESSAGE(what, ": worst parameter error after 3 steps ", v);
}

}  // namespace

TEST_CASE(
    "a model from parts (untied head): tensor 2 with and without SP, pipe 2 under 1F1B and ZB-H1, and data 2 under "
    "each strategy equal one rank within 1e-12 in double") {
  // 1e-12: the same sums in another order (the tensor shards' partial products, the micro-batches'
  // accumulation); double precision leaves about 1e-15 per operation.
  const Run ref = run<Untied<double>, OneFOneB>(1, 1, 1, 3);
  REQUIRE(ref.grads.count("lm_head") == 1);
  REQUIRE(ref.grads.count("wte") == 1);
  compare<Untied<double>, OneFOneB>(ref, 1, 2, 1, "tensor 2");
  compare<Untied<double, true>, OneFOneB>(ref, 1, 2, 1, "tensor 2 with SP");
  compare<Untied<double>, OneFOneB>(ref, 2, 1, 1, "pipe 2, 1F1B");
  compare<Untied<double>, ZeroBubbleH1>(ref, 2, 1, 1, "pipe 2, ZB-H1");
  compare<Untied<double>, OneFOneB, optim::Ddp>(ref, 1, 1, 2, "data 2, DDP");
  compare<Untied<double>, OneFOneB, optim::Zero1>(ref, 1, 1, 2, "data 2, ZeRO-1");
  compare<Untied<double>, OneFOneB, optim::Zero2>(ref, 1, 1, 2, "data 2, ZeRO-2");
  compare<Untied<double>, OneFOneB, optim::Fsdp>(ref, 1, 1, 2, "data 2, FSDP");
  compare<Untied<double, true>, ZeroBubbleH1, optim::Fsdp>(ref, 2, 2, 2, "pipe 2 x tensor 2 x data 2, ZB-H1, FSDP, SP");
}

TEST_CASE("a model from parts: its head's table is its own unit entry, decayed as a Linear matrix, with logical rows") {
  run_threads(2, [](ThreadComm& w) {
    Mesh mesh{w, {.tensor = 2}};
    Host h;
    Untied<double> model(h, kConfig, mesh.spread(), kMicro);
    CHECK(!model.tied_unit());
    bool found = false;
    for (auto& u : model.units())
      for (const nn::UnitEntry& e : u.entries())
        if (e.name == "lm_head") {
          found = true;
          CHECK(u.name() == "head");
          CHECK(optim::decays(e));                                  // declared by HeadStage
          CHECK(e.global == Shape{34, kConfig.width});              // 33 padded to a multiple of 2
          CHECK(e.logical == Shape{kConfig.vocab, kConfig.width});  // from the Spec's finish()
        } else if (e.name == "wte") {
          CHECK(!optim::decays(e));
        }
    CHECK(found);
    // The record a checkpoint saves and a load compares: the fields that shape the parameters, with
    // this configuration's values (the seed and init_std, which choose values only, are not in it).
    const std::vector<std::pair<std::string, std::int64_t>> want{
        {"vocab", 33}, {"seq", 8}, {"layers", 4}, {"heads", 2}, {"width", 16}};
    CHECK(model.record() == want);
    // Errors name the model the Spec names.
    std::vector<std::int32_t> bad(static_cast<std::size_t>(kMicro * kConfig.seq), 40);
    CHECK_THROWS_WITH_AS(model.in_flight({{bad, bad}, kMicro}), doctest::Contains("UntiedGpt::in_flight: token 40"),
                         Error);
  });
}
