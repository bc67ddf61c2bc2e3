// Optimizers and the data-parallel protocol: schedules, the AdamW step against its closed form,
// parameter groups, global-norm clipping that counts every element once, and DDP, ZeRO-1, ZeRO-2
// and FSDP training equal to single-rank training, with their memory against its formula.
#include <doctest/doctest.h>

#include <limits>

#include <cmath>
#include <map>
#include <mutex>
#include <optional>

#include "support/error.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/data/loader.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/optim/schedule.hpp"

using namespace weft;

TEST_CASE("learning-rate schedules: constant, and linear warm-up then cosine to the floor") {
  const auto c = optim::Schedule::constant(3e-4);
  CHECK(c.lr(0) == 3e-4);
  CHECK(c.lr(100000) == 3e-4);
  const auto s = optim::Schedule::warmup_cosine(1e-3, 10, 110, 1e-4);
  CHECK(s.lr(0) == doctest::Approx(1e-4));     // (0 + 1) / 10 of the peak
  CHECK(s.lr(9) == doctest::Approx(1e-3));     // the end of warm-up
  CHECK(s.lr(60) == doctest::Approx(5.5e-4));  // half way down the cosine: (max + min) / 2
  CHECK(s.lr(110) == doctest::Approx(1e-4));
  CHECK(s.lr(500) == doctest::Approx(1e-4));
  CHECK_THROWS_WITH_AS(optim::Schedule::warmup_cosine(1e-3, 20, 10, 0), doctest::Contains("warm-up 20, total 10"),
                       Error);
  // NaN compares false with everything: each rate is refused when it is not finite.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(optim::Schedule::warmup_cosine(nan, 1, 10, 0), doctest::Contains("max lr nan"), Error);
  CHECK_THROWS_WITH_AS(optim::Schedule::warmup_cosine(1e-3, 1, 10, nan), doctest::Contains("min lr nan"), Error);
  CHECK_THROWS_WITH_AS(optim::Schedule::warmup_cosine(inf, 1, 10, 0), doctest::Contains("use finite rates"), Error);
}

TEST_CASE("the AdamW step matches its closed form") {
  // Three steps on one element by hand (PyTorch's AdamW): m, v moments, bias corrections, decoupled decay.
  double p = 0.5, m = 0, v = 0;
  const double lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1, g[3] = {0.3, -0.2, 0.1};
  double ref = 0.5, rm = 0, rv = 0;
  for (int t = 1; t <= 3; ++t) {
    const math::AdamWParams<double> a{lr, b1, b2, eps, wd, 1 - std::pow(b1, t), 1 - std::pow(b2, t)};
    math::adamw_step(p, g[t - 1], m, v, a, true);
    rm = b1 * rm + (1 - b1) * g[t - 1];
    rv = b2 * rv + (1 - b2) * g[t - 1] * g[t - 1];
    ref = ref - lr * wd * ref - lr * (rm / (1 - std::pow(b1, t))) / (std::sqrt(rv / (1 - std::pow(b2, t))) + eps);
  }
  CHECK(p == doctest::Approx(ref).epsilon(1e-15));
}

TEST_CASE("parameter groups: only Linear matrices are decayed") {
  run_threads(1, [](ThreadComm& w) {
    Mesh mesh{w, {}};
    Host h;
    gpt2::Model<double> gpt(h, {.vocab = 16, .seq = 4, .layers = 1, .heads = 2, .width = 8}, mesh.spread(), 1);
    std::vector<std::string> decayed;
    for (auto& u : gpt.units())
      for (const nn::UnitEntry& e : u.entries())
        if (optim::decays(e)) decayed.push_back(e.name);
    CHECK(decayed == std::vector<std::string>{"h0.attn.qkv.weight", "h0.attn.proj.weight", "h0.mlp.fc.weight",
                                              "h0.mlp.proj.weight"});
  });
}

TEST_CASE("parameter groups: the layers declare them, not the names, and a model overrides them by name") {
  // The groups used to be decided by shape and by the names "wte" and "wpe": another model's
  // embedding table ("tok_embeddings") was decayed, and a Linear matrix named "wte" was not.
  Host h;
  nn::Unit<double, Host> u("mixed", h);
  nn::VocabParallelEmbedding<double> table(h, 16, 8, {}, 1, 7, 0.02);
  nn::Linear<double, nn::NoParallel> lin(h, 8, 4, {}, 2, 7);
  u.add("tok_embeddings", table);
  u.add_param("wte", lin.weight);
  u.add_param("proj.bias", lin.bias);
  u.build(1);
  std::map<std::string, bool> decayed;
  for (const nn::UnitEntry& e : u.entries()) decayed[e.name] = optim::decays(e);
  CHECK(decayed == std::map<std::string, bool>{{"tok_embeddings", false}, {"wte", true}, {"proj.bias", false}});
  CHECK(u.set_decay("tok_embeddings", nn::Decay::yes));
  CHECK(!u.set_decay("no_such.weight", nn::Decay::yes));
  CHECK(optim::decays(u.entries()[0]));

  // The override reaches the update: one SGD step with zero gradients and decay wd multiplies a
  // decayed parameter by exactly 1 - lr wd (lr 0.5, wd 0.25: 0.875, exact in binary) and leaves
  // the others unchanged.
  run_threads(1, [](ThreadComm& w) {
    Mesh mesh{w, {}};
    Host dev;
    gpt2::Model<double> gpt(dev, {.vocab = 16, .seq = 4, .layers = 1, .heads = 2, .width = 8}, mesh.spread(), 1);
    std::size_t found = 0;
    for (auto& unit : gpt.units()) found += unit.set_decay("wte", nn::Decay::yes);
    REQUIRE(found == 1);
    std::map<std::string, std::vector<double>> before;
    gpt.for_each_param(
        [&](const std::string& n, auto& p) { before[n].assign(p.value.data(), p.value.data() + p.value.numel()); });
    auto sgd = optim::data_parallel<optim::Ddp>(gpt, optim::Sgd{.momentum = 0, .weight_decay = 0.25}, mesh);
    gpt.zero_grad();
    sgd.step(0.5, 0.0);
    gpt.for_each_param([&](const std::string& n, auto& p) {
      const bool d = n == "wte" || n == "h0.attn.qkv.weight" || n == "h0.attn.proj.weight" || n == "h0.mlp.fc.weight" ||
                     n == "h0.mlp.proj.weight";
      for (std::int64_t i = 0; i < p.value.numel(); ++i)
        REQUIRE(p.value.data()[i] == (d ? 0.875 : 1.0) * before.at(n)[static_cast<std::size_t>(i)]);
    });
  });
}

namespace {

const gpt2::Config kOptimConfig{
    .vocab = 33, .seq = 8, .layers = 2, .heads = 4, .width = 16, .seed = 9, .init_std = 0.1};
constexpr std::int64_t kBatch = 4;

struct Trained {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<double>> params;
};

// 5 steps of AdamW with clipping on the Markov corpus, gathering the global parameters at the end.
template <bool SP, class Strategy = optim::Ddp>
Trained train_run(int data, int tensor, std::int64_t* state_bytes = nullptr, std::int64_t* param_peak = nullptr,
                  std::int64_t* param_now = nullptr) {
  Trained out;
  std::mutex mu;
  const data::MarkovSource corpus(kOptimConfig.vocab, 4);
  run_threads(data * tensor, [&](ThreadComm& world) {
    Mesh mesh{world, {.data = data, .tensor = tensor}};
    Host h;
    gpt2::Model<double, SP> gpt(h, kOptimConfig, mesh.spread(), kBatch);
    const std::int64_t before = h.memory().current_of(Category::optimizer_state);
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{.config = {.lr = 1e-2}}, mesh);
    if (param_now && world.rank() == 0) *param_now = h.memory().current_of(Category::parameters);
    h.allocator.reset_peak();
    if (state_bytes && world.rank() == 0) *state_bytes = h.memory().current_of(Category::optimizer_state) - before;
    data::Loader<data::MarkovSource> loader(corpus, kOptimConfig.seq, kBatch, data, mesh.coord().data);
    std::vector<std::int32_t> x, y;
    for (int step = 0; step < 5; ++step) {
      loader.next(x, y);
      dp.zero_grad();
      auto ctx = gpt.in_flight({{x, y}, kBatch});
      const double loss = pipeline::forward_backward(gpt, ctx, mesh, dp);
      const double norm = dp.step(1e-2, 0.5);
      if (world.rank() == 0) {
        std::lock_guard lock(mu);
        out.losses.push_back(loss);
        out.norms.push_back(norm);
      }
    }
    if (param_peak && world.rank() == 0) *param_peak = h.memory().peak_of(Category::parameters);
    dp.gather_values();
    gpt.for_each_param([&](const std::string& name, auto& p) {
      const auto v = redistribute<Replicated>(p.value, mesh);
      if (world.rank() != 0) return;
      std::lock_guard lock(mu);
      out.params[name].assign(v.data(),
                              v.data() + (name == "wte" ? kOptimConfig.vocab * kOptimConfig.width : v.numel()));
    });
  });
  return out;
}

// Parameter elements on one rank of one block, of the embedding stage (wte, wpe) and of the head
// stage (ln_f), counted from the layers' parameters: the units that ZeRO and FSDP shard.
struct UnitSizes {
  std::int64_t block = 0, embedding = 0, head = 0;
};
UnitSizes unit_sizes() {
  UnitSizes n;
  run_threads(1, [&](ThreadComm& w) {
    Mesh mesh{w, {}};
    Host h;
    gpt2::Model<double> gpt(h, kOptimConfig, mesh.spread(), kBatch);
    const auto count = [](std::int64_t& n) { return [&n](const std::string&, auto& p) { n += p.value.numel(); }; };
    gpt.blocks[0].for_each_param("h0", count(n.block));
    gpt.embedding.for_each_param("", count(n.embedding));
    gpt.head.for_each_param("", count(n.head));
  });
  return n;
}

}  // namespace

TEST_CASE("DDP (alone and with tensor parallelism) trains like one rank: 5 AdamW steps within 1e-12") {
  const Trained ref = train_run<false>(1, 1);
  CHECK(ref.losses.back() < ref.losses.front());  // it learns
  for (auto [dp, tp] : {std::pair{2, 1}, {4, 1}, {2, 2}}) {
    for (const Trained& t : {train_run<false>(dp, tp), train_run<true>(dp, tp)}) {
      double worst = 0;
      for (std::size_t s = 0; s < ref.losses.size(); ++s) {
        worst = test::worse(worst, std::fabs(t.losses[s] - ref.losses[s]) / ref.losses[s]);
        // The clipping norm counts every global element once: the same on every mesh.
        CHECK(t.norms[s] == doctest::Approx(ref.norms[s]).epsilon(1e-12));
      }
      // The global parameter vector: max |difference| over max |parameter|, over the whole model.
      // (Per tensor, the key biases would stand out at ~1e-11: their exact gradient is zero, as the
      // softmax ignores a constant added to a row of scores, so their values are rounding noise of
      // ~1e-13 that Adam's normalization turns into updates; against their tensor's q and v biases
      // that is 1e-11, against the model it is below 1e-12.)
      double diff = 0, scale = 0;
      for (const auto& [name, v] : ref.params)
        for (std::size_t i = 0; i < v.size(); ++i) {
          diff = test::worse(diff, std::fabs(t.params.at(name)[i] - v[i]));
          scale = std::max(scale, std::fabs(v[i]));
        }
      worst = test::worse(worst, diff / scale);
      CHECK_MESSAGE(worst <= 1e-12, "data ", dp, " x tensor ", tp, ": ", worst);
      MESSAGE("data ", dp, " x tensor ", tp, ": worst relative difference after 5 steps ", worst);
    }
  }
}

TEST_CASE("ZeRO-1 and ZeRO-2 train like one rank and keep about 1/dp of the optimizer state") {
  const Trained ref = train_run<false>(1, 1);
  std::int64_t full_state = 0;
  train_run<false>(1, 1, &full_state);
  for (auto [dp, tp] : {std::pair{2, 1}, {4, 1}, {2, 2}}) {
    std::int64_t s1 = 0, s2 = 0;
    const Trained z1 = train_run<false, optim::Zero1>(dp, tp, &s1), z2 = train_run<true, optim::Zero2>(dp, tp, &s2);
    CHECK(z2.losses.size() == 5);
    for (const Trained* t : {&z1, &z2}) {
      double diff = 0, scale = 0;
      for (const auto& [name, v] : ref.params)
        for (std::size_t i = 0; i < v.size(); ++i) {
          diff = test::worse(diff, std::fabs(t->params.at(name)[i] - v[i]));
          scale = std::max(scale, std::fabs(v[i]));
        }
      CHECK_MESSAGE(diff / scale <= 1e-12, "data ", dp, " x tensor ", tp, ": ", diff / scale);
      for (std::size_t s = 0; s < ref.norms.size(); ++s)
        CHECK(t->norms[s] == doctest::Approx(ref.norms[s]).epsilon(1e-12));
      MESSAGE("ZeRO data ", dp, " x tensor ", tp, ": worst relative difference ", diff / scale);
    }
    // The state of this rank: 2 doubles per element of its slice, the slice being ceil(P / dp) of
    // its P local parameter elements (P = the one-rank count / tp for sharded parameters).
    const double expect = static_cast<double>(full_state) / tp / dp;
    CHECK(static_cast<double>(s1) <= expect * 1.3);  // tensor-replicated parameters are not divided by tp
    CHECK(static_cast<double>(s1) >= expect * 0.99);
    CHECK(s2 == s1);  // both keep state for the same slices of the same units
    CHECK(static_cast<double>(s2) <= expect * 1.3);
    MESSAGE("optimizer state per rank: ", s1, " bytes (one rank, AdamW: ", full_state, ")");
  }
}

TEST_CASE("FSDP trains like one rank and holds about 1/dp of the parameters plus one gathered block") {
  const Trained ref = train_run<false>(1, 1);
  for (auto [dp, tp] : {std::pair{2, 1}, {4, 1}, {2, 2}}) {
    for (const Trained& t : {train_run<false, optim::Fsdp>(dp, tp), train_run<true, optim::Fsdp>(dp, tp)}) {
      double diff = 0, scale = 0;
      for (const auto& [name, v] : ref.params)
        for (std::size_t i = 0; i < v.size(); ++i) {
          diff = test::worse(diff, std::fabs(t.params.at(name)[i] - v[i]));
          scale = std::max(scale, std::fabs(v[i]));
        }
      CHECK_MESSAGE(diff / scale <= 1e-12, "data ", dp, " x tensor ", tp, ": ", diff / scale);
      for (std::size_t s = 0; s < ref.norms.size(); ++s)
        CHECK(t.norms[s] == doctest::Approx(ref.norms[s]).epsilon(1e-12));
      MESSAGE("FSDP data ", dp, " x tensor ", tp, ": worst relative difference ", diff / scale);
    }
  }
  // Memory at data 4, from the unit sizes of a one-rank model. Each unit is padded to a multiple of
  // dp and sliced: a slice is ceil(n / dp) elements.
  const UnitSizes n = unit_sizes();
  const int dp = 4;
  const auto slice = [&](std::int64_t k) { return (k + dp - 1) / dp; };
  const std::int64_t sb = slice(n.block), se = slice(n.embedding), sh = slice(n.head);
  std::int64_t peak = 0, now = 0;
  train_run<false, optim::Fsdp>(dp, 1, nullptr, &peak, &now);
  // At rest: the slices. During a step: the slices, the embedding unit gathered (the tied table is
  // used by the first and the last stage, so it stays from the embedding's forward to its backward),
  // and one block gathered (larger than the head unit, gathered alone beside the embedding).
  CHECK(now == (kOptimConfig.layers * sb + se + sh) * 8);
  CHECK(peak == (kOptimConfig.layers * sb + se + sh) * 8 + se * dp * 8 + sb * dp * 8);
  MESSAGE("FSDP data 4: parameters ", now, " bytes at rest, peak ", peak,
          " in a step (one rank: ", (kOptimConfig.layers * n.block + n.embedding + n.head) * 8, ")");
}

TEST_CASE("optimizer state per rank equals its formula for every strategy") {
  // AdamW keeps 2 values per element of the range a rank updates: under DDP each unit padded to a
  // multiple of dp, under ZeRO and FSDP the rank's slice of it, ceil(n / dp) (one rank, tensor 1).
  const UnitSizes n = unit_sizes();
  for (int dp : {2, 4}) {
    const auto slice = [&](std::int64_t k) { return (k + dp - 1) / dp; };
    const std::int64_t slices = kOptimConfig.layers * slice(n.block) + slice(n.embedding) + slice(n.head);
    std::int64_t ddp = 0, z1 = 0, z2 = 0, fsdp = 0;
    train_run<false, optim::Ddp>(dp, 1, &ddp);
    train_run<false, optim::Zero1>(dp, 1, &z1);
    train_run<false, optim::Zero2>(dp, 1, &z2);
    train_run<false, optim::Fsdp>(dp, 1, &fsdp);
    CHECK(ddp == 2 * slices * dp * 8);
    CHECK(z1 == 2 * slices * 8);
    CHECK(z2 == 2 * slices * 8);
    CHECK(fsdp == 2 * slices * 8);
    MESSAGE("data ", dp, ": AdamW state per rank ", ddp, " bytes (DDP), ", z1, " (ZeRO-1, ZeRO-2, FSDP)");
  }
}

TEST_CASE("ZeRO-2 holds gradients for 1/dp of the parameters at rest and one unit in full during backward") {
  const UnitSizes n = unit_sizes();
  const int dp = 4;
  const auto slice = [&](std::int64_t k) { return (k + dp - 1) / dp; };
  const std::int64_t sb = slice(n.block), se = slice(n.embedding), sh = slice(n.head);
  std::int64_t grads_now = 0, grads_peak = 0;
  run_threads(dp, [&](ThreadComm& w) {
    Mesh mesh{w, {.data = dp}};
    Host h;
    gpt2::Model<double> gpt(h, kOptimConfig, mesh.spread(), kBatch);
    auto z = optim::data_parallel<optim::Zero2>(gpt, optim::AdamW{.config = {.lr = 1e-2}}, mesh);
    const std::int64_t now = h.memory().current_of(Category::gradients);
    h.allocator.reset_peak();
    const data::MarkovSource corpus(kOptimConfig.vocab, 4);
    data::Loader<data::MarkovSource> loader(corpus, kOptimConfig.seq, kBatch, dp, mesh.coord().data);
    std::vector<std::int32_t> x, y;
    loader.next(x, y);
    z.zero_grad();
    auto ctx = gpt.in_flight({{x, y}, kBatch});
    pipeline::forward_backward(gpt, ctx, mesh, z);
    z.step(1e-2, 1.0);
    if (w.rank() == 0) {
      grads_now = now;
      grads_peak = h.memory().peak_of(Category::gradients);
    }
  });
  // The embedding unit's full gradient lives from the head's backward to the embedding's; a block's
  // during its own backward.
  CHECK(grads_now == (kOptimConfig.layers * sb + se + sh) * 8);
  CHECK(grads_peak == (kOptimConfig.layers * sb + se + sh) * 8 + se * dp * 8 + sb * dp * 8);
  MESSAGE("ZeRO-2 data 4: gradients ", grads_now, " bytes at rest, peak ", grads_peak,
          " (one rank: ", (kOptimConfig.layers * n.block + n.embedding + n.head) * 8, ")");
}

TEST_CASE("SGD with momentum matches its closed form and clipping brings the norm to the limit") {
  run_threads(2, [](ThreadComm& w) {
    Mesh mesh{w, {.tensor = 2}};
    Host h;
    gpt2::Model<double> gpt(h, {.vocab = 16, .seq = 4, .layers = 1, .heads = 2, .width = 8}, mesh.spread(), 1);
    const auto set_grads = [&](double g) {
      gpt.for_each_param([&](const std::string&, auto& p) {
        for (std::int64_t i = 0; i < p.grad.numel(); ++i) p.grad[i] = g;
      });
    };
    const auto values = [&] {
      std::map<std::string, std::vector<double>> v;
      gpt.for_each_param(
          [&](const std::string& n, auto& p) { v[n].assign(p.value.data(), p.value.data() + p.value.numel()); });
      return v;
    };
    // Gradients set by hand: g = 1 everywhere. Two SGD steps (lr 0.1, momentum 0.9, decay 0.01):
    // buf1 = g + wd p0, p1 = p0 - lr buf1; buf2 = 0.9 buf1 + g + wd p1, p2 = p1 - lr buf2.
    const auto p0 = values();
    {
      auto sgd = optim::data_parallel<optim::Ddp>(gpt, optim::Sgd{.momentum = 0.9, .weight_decay = 0.01}, mesh);
      set_grads(1.0);
      sgd.step(0.1, 0.0);
      set_grads(1.0);
      sgd.step(0.1, 0.0);
    }
    const auto p2 = values();
    std::map<std::string, bool> decayed;
    for (auto& u : gpt.units())
      for (const nn::UnitEntry& e : u.entries()) decayed[e.name] = optim::decays(e);
    for (const auto& [n, v] : p0) {
      const double wd = decayed.at(n) ? 0.01 : 0.0;
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double a = v[i], b1 = 1 + wd * a, a1 = a - 0.1 * b1;
        const double b2 = 0.9 * b1 + 1 + wd * a1, a2 = a1 - 0.1 * b2;
        REQUIRE(p2.at(n)[i] == doctest::Approx(a2).epsilon(1e-14));
      }
    }
    // Clipping: all-ones gradients have the norm sqrt(global elements), each counted once (16 is a
    // multiple of 2: no padded vocabulary rows). Plain SGD at lr 1 then moves the parameters by
    // exactly the clipped gradient, whose global norm is the limit.
    std::int64_t global = 0;
    gpt.for_each_param([&](const std::string&, auto& p) { global += p.grad.global_shape().numel(); });
    auto plain = optim::data_parallel<optim::Ddp>(gpt, optim::Sgd{.momentum = 0}, mesh);
    set_grads(1.0);
    const double norm = plain.step(1.0, 2.0);
    CHECK(norm == doctest::Approx(std::sqrt(static_cast<double>(global))).epsilon(1e-14));
    const auto p3 = values();
    std::vector<double> sq{0.0};
    gpt.for_each_param([&](const std::string& n, auto& p) {
      using P = std::remove_cvref_t<decltype(p)>;
      if (!IsShard<typename P::layout::tensor> && w.rank() != 0) return;  // replicas once
      for (std::size_t i = 0; i < p2.at(n).size(); ++i)
        sq[0] += (p2.at(n)[i] - p3.at(n)[i]) * (p2.at(n)[i] - p3.at(n)[i]);
    });
    mesh.tensor().all_reduce(std::span<double>(sq));
    CHECK(std::sqrt(sq[0]) == doctest::Approx(2.0).epsilon(1e-6));  // max / (norm + 1e-6) scaling
  });
}
