// nn::MoeMlp (nn/moe.hpp, ops/moe.hpp) on the host in f64: against transformers' Mixtral, Qwen3-MoE
// and DeepSeek-V3 (sigmoid scores, an expert bias) blocks and a plain PyTorch reference with a
// capacity and with a shared expert
// (tools/reference/moe_block.py -> tests/fixtures/moe: the output, the load-balancing and z-losses
// and every gradient); the experts' order of the slots (nn::moe_plan) by hand; every gradient of a
// capacity-limited, not renormalised layer by finite differences, softmax and sigmoid scores; data 2 equal to one rank
// (the router's statistics summed over the data ranks); the expert exchange (nn/expert_dispatch.hpp) by hand and its
// round trip; the experts sharded over expert 2 and 4 equal to one rank, the exchange's bytes as its route says; bf16
// against the f64 fixture; FP8 experts over expert 2 and 4 equal to one rank, an overflow named by its expert; bad
// options refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "support/gradcheck.hpp"
#include "weft/checkpoint/import_dir.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/redistribute.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/core/float8_gemms.hpp"
#include "weft/nn/comm_walk.hpp"
#include "weft/nn/expert_dispatch.hpp"
#include "weft/nn/layer_walk.hpp"
#include "weft/nn/moe.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/optim/data_parallel.hpp"

using namespace weft;

namespace {

using A = nn::act::Full;
using Moe = nn::MoeMlp<double, A, Host>;
using X = Tensor<double, A, Host>;

// transformers' gate_up (E, 2H, C), the H gate rows then the H up rows, as weft's (E, H, 2, C).
std::vector<double> interleave(std::span<const double> hf, std::int64_t E, std::int64_t H, std::int64_t C) {
  std::vector<double> out(hf.size());
  for (std::int64_t e = 0; e < E; ++e)
    for (std::int64_t f = 0; f < H; ++f)
      for (std::int64_t half = 0; half < 2; ++half)
        std::copy_n(hf.begin() + ((e * 2 + half) * H + f) * C, C, out.begin() + ((e * H + f) * 2 + half) * C);
  return out;
}

void set(std::span<double> to, const std::vector<double>& from) {
  REQUIRE(to.size() == from.size());
  std::copy(from.begin(), from.end(), to.begin());
}
template <class P>
std::span<double> values(P& p) {
  return {p.value.data(), static_cast<std::size_t>(p.value.numel())};
}
template <class P>
std::vector<double> grads(P& p) {
  return {p.grad.data(), p.grad.data() + p.grad.numel()};
}

// max |a - b| / max |b|, infinite on NaN.
double relative(std::span<const double> a, std::span<const double> b) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = test::worse(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return worst / scale;
}

// Parameter p's gradient over the ranks of an expert-sharded run, as one rank holds it: parameter 0
// (the router) summed over every rank, the experts' (1, 2) each over the ranks that hold it, laid
// end to end in expert order. Run: grads (every parameter as the rank holds it) and expert.
template <class Run>
std::vector<double> expert_grads(const std::vector<Run>& many, std::size_t p, int ep) {
  std::vector<double> whole;
  for (int e = 0; e < (p == 0 ? 1 : ep); ++e) {
    std::vector<double> sum(many[0].grads[p].size(), 0.0);
    for (const Run& r : many)
      if (p == 0 || r.expert == e)
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += r.grads[p][i];
    whole.insert(whole.end(), sum.begin(), sum.end());
  }
  return whole;
}

// Part e of `ep` equal parts of v.
std::vector<double> slice(const std::vector<double>& v, int ep, int e) {
  const std::size_t n = v.size() / static_cast<std::size_t>(ep);
  return {v.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(e)),
          v.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(e + 1))};
}

struct Fixture {
  checkpoint::ImportDir file;
  std::int64_t N, C, H, E, k, S, capacity, groups = 1, top_groups = 1;
  bool renormalise, sigmoid = false, bias = false;
  double scale = 1;
  explicit Fixture(const std::string& name)
      : file(std::string(WEFT_TEST_DATA_DIR) + "/moe", name, "moe fixture " + name) {
    const auto c = file.read("config");
    N = static_cast<std::int64_t>(c[0]), C = static_cast<std::int64_t>(c[1]), H = static_cast<std::int64_t>(c[2]);
    E = static_cast<std::int64_t>(c[3]), k = static_cast<std::int64_t>(c[4]), renormalise = c[5] != 0;
    S = static_cast<std::int64_t>(c[6]), capacity = static_cast<std::int64_t>(c[7]);
    if (c.size() > 8) sigmoid = c[8] != 0, scale = c[9] / 1000, bias = c[10] != 0;  // DeepSeek-V3's routing
    if (c.size() > 11) groups = static_cast<std::int64_t>(c[11]), top_groups = static_cast<std::int64_t>(c[12]);
  }
  nn::MoeOptions options() const {
    // The fixture's capacity, ceil(0.75 N k / E), from a factor over one sample of N tokens.
    return {.experts = E,
            .top_k = k,
            .hidden = H,
            .renormalise = renormalise,
            .capacity_factor = capacity > 0 ? 0.75 : 0.0,
            .aux_coef = 0.02,
            .z_coef = sigmoid ? 0.0 : 0.001,
            .shared_hidden = S,
            .score = sigmoid ? nn::Score::sigmoid : nn::Score::softmax,
            .scale = scale,
            .expert_bias = bias,
            .groups = groups,
            .top_groups = top_groups};
  }
  // The fixture's weights; where the experts are sharded over an expert group of `ep`, expert rank
  // e's slice of them.
  template <class L>
  void load(L& m, int ep = 1, int e = 0) const {
    set(values(m.router), file.read("router"));
    set(values(m.gate_up), slice(interleave(file.read("gate_up"), E, H, C), ep, e));
    set(values(m.down), slice(file.read("down"), ep, e));
    if (S > 0) {
      set(values(m.shared_up), interleave(file.read("shared_gate_up"), 1, S, C));
      set(values(m.shared_down), file.read("shared_down"));
    }
    if (bias) set(values(m.bias), file.read("bias"));
  }
  // The layer on one rank with the fixture's weights, and one sample of its N tokens: tensor
  // `name` ("x", "dy") of the fixture.
  Moe layer(Host& h, const Spread& s) const {
    Moe m(h, C, options(), s, 0, 1, 0.1, 0.1);
    load(m);
    return m;
  }
  X tokens(Host& h, const Spread& s, const char* name) const {
    auto t = X::empty(h, {1, N, C}, s, Category::activations);
    set({t.data(), static_cast<std::size_t>(t.numel())}, file.read(name));
    return t;
  }
};

void against(const std::string& name) {
  INFO(name);
  const Fixture f(name);
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Moe m = f.layer(h, mesh.spread());
    const auto x = f.tokens(h, mesh.spread(), "x"), dy = f.tokens(h, mesh.spread(), "dy");
    Moe::Ctx ctx;
    const auto y = m.forward(ctx, x, mesh);
    // The experts chosen, exactly.
    std::vector<std::int32_t> index(static_cast<std::size_t>(f.N * f.k));
    std::copy_n(static_cast<const std::int32_t*>(ctx.index.data()), index.size(), index.begin());
    const auto want = f.file.read("index");
    for (std::size_t i = 0; i < index.size(); ++i) CHECK(index[i] == static_cast<std::int32_t>(want[i]));
    // The expert load: the most slots an expert got over the mean (N k / E), from the reference's choice.
    std::vector<double> slots(static_cast<std::size_t>(f.E));
    for (double e : want) slots[static_cast<std::size_t>(e)] += 1;
    const double most = *std::max_element(slots.begin(), slots.end());
    CHECK(m.last_load ==
          doctest::Approx(most * static_cast<double>(f.E) / static_cast<double>(f.N * f.k)).epsilon(1e-15));
    CHECK(m.last_load > 1);
    // f64 against f64: the same sums in other orders.
    const double ey = relative({y.data(), static_cast<std::size_t>(y.numel())}, f.file.read("y"));
    CHECK(ey <= 1e-12);
    CHECK(std::abs(m.last_aux - f.file.read("aux")[0]) <= 1e-12 * f.file.read("aux")[0]);
    CHECK(std::abs(m.last_z - f.file.read("z")[0]) <= 1e-12 * f.file.read("z")[0]);  // 0 for sigmoid scores
    CHECK(m.last_dropped == (f.capacity > 0 ? 5 : 0));  // experts 0, 2 and 3 are sent 7, 6 and 7 of 24 slots
    const auto dx = m.backward(ctx, dy, mesh);
    double worst = relative({dx.data(), static_cast<std::size_t>(dx.numel())}, f.file.read("grad.x"));
    std::string where = "x";
    auto grad = [&](const char* n, const std::vector<double>& got, const std::vector<double>& ref) {
      const double e = relative(got, ref);
      if (e > worst) worst = e, where = n;
    };
    grad("router", grads(m.router), f.file.read("grad.router"));
    grad("gate_up", grads(m.gate_up), interleave(f.file.read("grad.gate_up"), f.E, f.H, f.C));
    grad("down", grads(m.down), f.file.read("grad.down"));
    if (f.S > 0) {
      grad("shared gate_up", grads(m.shared_up), interleave(f.file.read("grad.shared_gate_up"), 1, f.S, f.C));
      grad("shared down", grads(m.shared_down), f.file.read("grad.shared_down"));
    }
    if (f.bias) {  // not a derivative: the load the sign step moves the bias by, E (slots of e) - N k
      std::vector<double> load(static_cast<std::size_t>(f.E), static_cast<double>(-f.N * f.k));
      for (double e : want) load[static_cast<std::size_t>(e)] += static_cast<double>(f.E);
      CHECK(grads(m.bias) == load);
    }
    CHECK_MESSAGE(worst <= 1e-12, "worst gradient ", where);
    MESSAGE(name, ": output within ", ey, ", worst gradient (", where, ") within ", worst, " relative");
  });
}

}  // namespace

TEST_CASE(
    "MoeMlp equals transformers' Mixtral, Qwen3-MoE and DeepSeek-V3 blocks, and the plain reference with a "
    "capacity or a shared expert: output, router losses and every gradient in f64") {
  against("mixtral");
  against("qwen3");
  against("capacity");
  against("shared");
  against("deepseek");         // sigmoid scores, an expert bias that changes the choice, scale 2.5, a shared expert
  against("deepseek_groups");  // and group-limited: the top 3 of 8 experts from the top 2 of 4 groups
}

TEST_CASE("a router's step figures are its micro-batches' backward passes: a re-run forward counts once") {
  // The log's (train::Routing, nn::take_router_stats): two micro-batches, the first's forward run
  // twice (as recomputation does), each backward adding its forward's figures; taken, then empty.
  const Fixture f("capacity");
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Moe m = f.layer(h, mesh.spread());
    auto x = f.tokens(h, mesh.spread(), "x");
    const auto dy = f.tokens(h, mesh.spread(), "dy");
    std::vector<double> xs = f.file.read("x");
    std::vector<std::array<double, 4>> seen;  // aux, z, load, dropped of each micro-batch
    for (int i = 0; i < 2; ++i) {
      for (double& v : xs) v *= i == 0 ? 1.0 : -0.5;  // another micro-batch
      set({x.data(), xs.size()}, xs);
      Moe::Ctx ctx;
      for (int run = 0; run < (i == 0 ? 2 : 1); ++run) (void)m.forward(ctx, x, mesh);
      seen.push_back({m.last_aux, m.last_z, m.last_load, static_cast<double>(m.last_dropped)});
      (void)m.backward(ctx, dy, mesh);
    }
    CHECK(seen[0] != seen[1]);
    const auto t = m.take_step_stats();
    CHECK(t.batches == 2);
    CHECK(t.aux == seen[0][0] + seen[1][0]);
    CHECK(t.z == seen[0][1] + seen[1][1]);
    CHECK(t.load == seen[0][2] + seen[1][2]);
    CHECK(static_cast<double>(t.dropped) == seen[0][3] + seen[1][3]);
    CHECK(m.take_step_stats().batches == 0);
  });
}

TEST_CASE("moe_plan: slots expert by expert in token order, at most the capacity of each sample's per expert") {
  // 4 tokens in 2 samples of 2, top 1 of 2 experts, capacity 1: sample 0 sends both tokens to
  // expert 0 (the second dropped), sample 1 one to each.
  const std::vector<std::int32_t> index{0, 0, 0, 1};
  const nn::MoePlan p = nn::moe_plan(index, 4, 2, 2, 1, 1);
  CHECK(p.slot == std::vector<std::int32_t>{0, -1, 1, 2});
  CHECK(p.rows == std::vector<std::int32_t>{0, 2, 3});
  CHECK(p.offsets == std::vector<std::int64_t>{0, 2, 3});
  CHECK(p.dropped == 1);
  // Dropless: every slot kept, top 2 of 3.
  const std::vector<std::int32_t> two{2, 0, 0, 1, 1, 2};
  const nn::MoePlan q = nn::moe_plan(two, 3, 3, 3, 2, 0);
  CHECK(q.offsets == std::vector<std::int64_t>{0, 2, 4, 6});
  CHECK(q.rows == std::vector<std::int32_t>{0, 1, 1, 2, 0, 2});
  CHECK(q.slot == std::vector<std::int32_t>{4, 0, 1, 2, 3, 5});
}

TEST_CASE("balanced_moe_plan: moe_plan's counts for the Meta device's routing, slot i to expert i mod E") {
  // Samples whose slots E does not divide (so experts' counts differ by one), a last sample cut
  // short, capacities below, at and above a sample's share, dropless.
  for (const auto& [N, T, E, k] : std::vector<std::array<std::int64_t, 4>>{
           {12, 4, 3, 2}, {10, 4, 3, 2}, {7, 7, 5, 3}, {16, 8, 128, 8}, {9, 3, 4, 4}, {1, 1, 6, 1}})
    for (const std::int64_t cap : {0, 1, 2, 3, 100}) {
      INFO("N ", N, " T ", T, " E ", E, " k ", k, " capacity ", cap);
      std::vector<std::int32_t> index(static_cast<std::size_t>(N * k));
      for (std::size_t i = 0; i < index.size(); ++i)
        index[i] = static_cast<std::int32_t>(static_cast<std::int64_t>(i) % E);
      const nn::MoePlan want = nn::moe_plan(index, N, T, E, k, cap), got = nn::balanced_moe_plan(N, T, E, k, cap);
      CHECK(got.offsets == want.offsets);
      CHECK(got.dropped == want.dropped);
      std::vector<std::int64_t> per_sample;  // moe_plan's drops, sample by sample
      for (std::int64_t n0 = 0; n0 < N; n0 += T)
        per_sample.push_back(std::count(want.slot.begin() + n0 * k, want.slot.begin() + std::min(N, n0 + T) * k, -1));
      CHECK(got.sample_dropped == per_sample);
    }
}

namespace {

// Every gradient of L = sum(y g) + aux_coef aux + z_coef z, for a (2, 5, 6) input through a layer of
// options o (5 experts, a capacity that drops slots, a shared expert), against finite differences.
// With an expert bias (set to `bias`), which changes some tokens' experts: its buffer holds the
// load E (slots of e) - N k (before the capacity's drops), not a derivative.
void check_finite_differences(const nn::MoeOptions& o, std::uint64_t seed, const std::vector<double>& bias = {}) {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    const std::int64_t B = 2, T = 5, C = 6, N = B * T, E = o.experts;
    Moe m(h, C, o, mesh.spread(), 0, seed, 0.5, 0.5);
    if (o.expert_bias) set(values(m.bias), bias);
    auto x = X::empty(h, {B, T, C}, mesh.spread(), Category::activations);
    std::vector<double> xs = test::normals(static_cast<std::size_t>(B * T * C), 10 * seed + 1);
    const std::vector<double> g = test::normals(xs.size(), 10 * seed + 2);
    auto dy = X::empty(h, {B, T, C}, mesh.spread(), Category::activations);
    set({dy.data(), g.size()}, g);
    auto loss = [&] {
      set({x.data(), xs.size()}, xs);
      Moe::Ctx c;
      const auto y = m.forward(c, x, mesh);
      double l = o.aux_coef * m.last_aux + o.z_coef * m.last_z;
      for (std::size_t i = 0; i < g.size(); ++i) l += y.data()[i] * g[i];
      return l;
    };
    CHECK(std::isfinite(loss()));
    CHECK(m.last_dropped > 0);  // capacity ceil(1.0 * 5 * 2 / 5) = 2 a sample per expert
    Moe::Ctx ctx;
    set({x.data(), xs.size()}, xs);
    (void)m.forward(ctx, x, mesh);
    const std::vector<std::int32_t> chosen(static_cast<const std::int32_t*>(ctx.index.data()),
                                           static_cast<const std::int32_t*>(ctx.index.data()) + N * o.top_k);
    if (o.expert_bias) {  // the bias moved some choices: without it, the largest scores alone
      set(values(m.bias), std::vector<double>(static_cast<std::size_t>(E), 0.0));
      Moe::Ctx plain;
      (void)m.forward(plain, x, mesh);
      CHECK(!std::equal(chosen.begin(), chosen.end(), static_cast<const std::int32_t*>(plain.index.data())));
      set(values(m.bias), bias);
    }
    const auto dx = m.backward(ctx, dy, mesh);
    const std::vector<double> dxs(dx.data(), dx.data() + dx.numel());
    const auto r = test::gradcheck(xs, dxs, loss, 60);
    CHECK(r.worst <= 1e-6);  // support/gradcheck.hpp: fourth-order central differences in double
    int params = 0;
    m.for_each_param("moe", [&](const std::string& name, auto& p) {
      INFO(name);
      if (name == "moe.router.bias") {
        std::vector<double> load(static_cast<std::size_t>(E), static_cast<double>(-N * o.top_k));
        for (std::int32_t e : chosen) load[static_cast<std::size_t>(e)] += static_cast<double>(E);
        CHECK(grads(p) == load);
        return;
      }
      const auto rp = test::gradcheck(
          values(p), std::span<const double>(p.grad.data(), static_cast<std::size_t>(p.grad.numel())), loss, 60);
      CHECK(rp.checked > 0);
      CHECK(rp.worst <= 1e-6);
      ++params;
    });
    CHECK(params == 5);
  });
}

}  // namespace

namespace {
// The finite-difference layers' common part: a capacity factor of 1 (which drops slots), a
// load-balancing coefficient of 0.3 and a shared expert of width 3, over `o`'s routing.
nn::MoeOptions dropping(nn::MoeOptions o) {
  o.capacity_factor = 1.0;
  o.aux_coef = 0.3;
  o.shared_hidden = 3;
  return o;
}
}  // namespace

TEST_CASE("MoeMlp's gradients match finite differences: top 2 of 5 not renormalised, a capacity, a shared expert") {
  check_finite_differences(dropping({.experts = 5, .top_k = 2, .hidden = 4, .renormalise = false, .z_coef = 0.05}), 1);
}

TEST_CASE("MoeMlp's gradients match finite differences with Qwen3-30B-A3B's 128 experts, top 8, renormalised") {
  check_finite_differences(dropping({.experts = 128, .top_k = 8, .hidden = 2, .renormalise = true, .z_coef = 0.05}), 3);
}

TEST_CASE(
    "MoeMlp's gradients with sigmoid scores match finite differences: an expert bias, a scale, a capacity, a shared "
    "expert") {
  for (const bool renormalise : {true, false}) {
    INFO("renormalised: ", renormalise);
    check_finite_differences(dropping({.experts = 5,
                                       .top_k = 2,
                                       .hidden = 4,
                                       .renormalise = renormalise,
                                       .z_coef = 0,
                                       .score = nn::Score::sigmoid,
                                       .scale = 1.7,
                                       .expert_bias = true}),
                             2, {0.4, -0.3, 0.0, 0.2, -0.5});
  }
}

TEST_CASE("MoeMlp's gradients with group-limited routing match finite differences: top 3 from 2 of 4 groups") {
  check_finite_differences(dropping({.experts = 8,
                                     .top_k = 3,
                                     .hidden = 2,
                                     .renormalise = true,
                                     .z_coef = 0,
                                     .score = nn::Score::sigmoid,
                                     .scale = 2.5,
                                     .expert_bias = true,
                                     .groups = 4,
                                     .top_groups = 2}),
                           4, {0.3, -0.2, 0.1, 0.0, -0.4, 0.2, -0.1, 0.4});
}

TEST_CASE("the expert bias's sign step alone balances a router that sends every token to two of four experts") {
  // Sigmoid scores from a router whose rows 0 and 1 read a feature that is 1 in every token: experts
  // 0 and 1 get nearly every slot (load near 2, the most there is for top 2 of 4). The weights stay put (SGD at
  // lr 0); only the bias moves, by its sign step (rate 0.02) in DataParallel's step, from the load in
  // its buffer. Deterministic: the same 32 tokens every step.
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    const nn::MoeOptions o{.experts = 4,
                           .top_k = 2,
                           .hidden = 4,
                           .aux_coef = 0,
                           .z_coef = 0,
                           .score = nn::Score::sigmoid,
                           .expert_bias = true,
                           .bias_rate = 0.02};
    const std::int64_t B = 4, T = 8, C = 6;
    Moe m(h, C, o, mesh.spread(), 0, 3, 0.5, 0.2);
    std::vector<nn::Unit<double, Host>> units;
    units.emplace_back("router", h);
    units.emplace_back("experts", h);
    m.for_each_param("moe", [&](const std::string& name, auto& p) {
      units[name.starts_with("moe.experts") ? 1 : 0].add_param(name, p);
    });
    for (auto& u : units) u.build(1);
    std::vector<double> w(values(m.router).begin(), values(m.router).end());
    for (std::int64_t e = 0; e < 2; ++e) w[static_cast<std::size_t>(e * C)] = 1.5;  // experts 0 and 1 read feature 0
    set(values(m.router), w);
    optim::DataParallel<optim::Ddp, optim::Sgd, double, decltype(mesh)> dp(units, optim::Sgd{.momentum = 0}, mesh);
    auto x = X::empty(h, {B, T, C}, mesh.spread(), Category::activations);
    auto dy = X::empty(h, {B, T, C}, mesh.spread(), Category::activations);
    std::vector<double> xs = test::normals(static_cast<std::size_t>(B * T * C), 31);
    for (std::int64_t n = 0; n < B * T; ++n) xs[static_cast<std::size_t>(n * C)] = 1.0;
    set({dy.data(), static_cast<std::size_t>(dy.numel())}, test::normals(xs.size(), 32));
    std::vector<double> load;
    for (int step = 0; step < 40; ++step) {
      set({x.data(), xs.size()}, xs);
      dp.zero_grad();
      Moe::Ctx ctx;
      (void)m.forward(ctx, x, mesh);
      load.push_back(m.last_load);
      (void)m.backward(ctx, dy, mesh);
      dp.step(0.0, 0.0);
    }
    CHECK(load.front() >= 1.9);  // 31 of the 32 tokens to experts 0 and 1
    const double last = *std::max_element(load.end() - 20, load.end());
    CHECK(last <= 1.25);  // the most slots an expert gets over the last 20 steps, over the mean of 16
    MESSAGE("expert load: step 0 ", load.front(), ", step 10 ", load[10], ", the last 20 steps' most ", last);
  });
}

TEST_CASE(
    "MoeMlp on data 2 equals one rank: each rank's rows, and the gradients summed (the router's losses over "
    "the whole batch)") {
  const Fixture f("mixtral");
  const std::int64_t B = 2, T = f.N / 2;
  struct Run {
    std::vector<double> y, dx, aux;
    std::vector<std::vector<double>> grads;
  };
  auto run = [&](int data) {
    std::vector<Run> out(static_cast<std::size_t>(data));
    run_threads(data, [&](ThreadComm& world) {
      Host h;
      Mesh mesh{world, {.data = data}};
      Moe m(h, f.C, f.options(), mesh.spread(), 0, 1, 0.1, 0.1);
      f.load(m);
      const std::int64_t Bl = B / data, first = mesh.coord().data * Bl * T * f.C;
      auto x = X::empty(h, {B, T, f.C}, mesh.spread(), Category::activations);
      auto dy = X::empty(h, {B, T, f.C}, mesh.spread(), Category::activations);
      const auto xs = f.file.read("x"), g = f.file.read("dy");
      std::copy_n(xs.begin() + first, x.numel(), x.data());
      std::copy_n(g.begin() + first, dy.numel(), dy.data());
      Moe::Ctx ctx;
      const auto y = m.forward(ctx, x, mesh);
      const auto dx = m.backward(ctx, dy, mesh);
      Run& r = out[static_cast<std::size_t>(mesh.coord().data)];
      r.y.assign(y.data(), y.data() + y.numel());
      r.dx.assign(dx.data(), dx.data() + dx.numel());
      r.aux = {m.last_aux, m.last_z, m.last_load};
      m.for_each_param("", [&](const std::string&, auto& p) { r.grads.push_back(grads(p)); });
    });
    return out;
  };
  const auto one = run(1);
  const auto two = run(2);
  std::vector<double> y, dx;
  for (const Run& r : two) {
    y.insert(y.end(), r.y.begin(), r.y.end());
    dx.insert(dx.end(), r.dx.begin(), r.dx.end());
    CHECK(r.aux == one[0].aux);  // the same sums: exact
  }
  CHECK(relative(y, one[0].y) <= 1e-14);
  CHECK(relative(dx, one[0].dx) <= 1e-14);
  for (std::size_t p = 0; p < one[0].grads.size(); ++p) {
    std::vector<double> sum = two[0].grads[p];
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += two[1].grads[p][i];
    CHECK_MESSAGE(relative(sum, one[0].grads[p]) <= 1e-13, "parameter ", p);  // the two halves' sums added
  }
}

TEST_CASE(
    "dispatch sends each rank's rows to their experts' ranks in expert, then source order, and combine undoes it") {
  // 8 experts over an expert group of 4 (2 each); rank r sends counts[r][e] rows to expert e, some
  // none at all (rank 3 sends nothing, expert 5 gets nothing); a row's value names its sender, its
  // expert and its place, in 3 columns.
  constexpr int ep = 4;
  constexpr std::int64_t E = 8, w = 3;
  const std::array<std::array<std::int64_t, E>, ep> counts{
      {{2, 0, 1, 3, 0, 0, 1, 2}, {0, 4, 0, 0, 2, 0, 0, 1}, {1, 1, 1, 1, 1, 0, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 0}}};
  auto row = [](int rank, std::int64_t e, std::int64_t i) {
    return std::array<double, w>{static_cast<double>(rank), static_cast<double>(e), static_cast<double>(i)};
  };
  run_threads(ep, [&](ThreadComm& world) {
    Host h;
    const int me = world.rank();
    std::vector<double> in;  // sender order: expert by expert
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t i = 0; i < counts[static_cast<std::size_t>(me)][static_cast<std::size_t>(e)]; ++i)
        for (double v : row(me, e, i)) in.push_back(v);
    const auto& mine = counts[static_cast<std::size_t>(me)];
    const nn::ExpertRoute r = nn::expert_route(world, std::span<const std::int64_t>(mine));
    const auto before = world.counters();
    std::vector<double> out(static_cast<std::size_t>(r.received() * w));
    nn::dispatch(h, world, r, in.data(), out.data(), w);
    // Receiver order: local expert by local expert, then source by source, each source's rows in order.
    std::vector<double> want;
    for (std::int64_t e = me * 2; e < me * 2 + 2; ++e)
      for (int src = 0; src < ep; ++src)
        for (std::int64_t i = 0; i < counts[static_cast<std::size_t>(src)][static_cast<std::size_t>(e)]; ++i)
          for (double v : row(src, e, i)) want.push_back(v);
    CHECK(out == want);
    const std::vector<std::int64_t> off = r.offsets();
    std::int64_t first = 0, second = 0;  // the rows of this rank's two experts
    for (int src = 0; src < ep; ++src) {
      first += counts[static_cast<std::size_t>(src)][static_cast<std::size_t>(me * 2)];
      second += counts[static_cast<std::size_t>(src)][static_cast<std::size_t>(me * 2 + 1)];
    }
    CHECK(off == std::vector<std::int64_t>{0, first, first + second});
    std::vector<double> back(in.size(), -1);
    nn::combine(h, world, r, out.data(), back.data(), w);
    CHECK(back == in);  // tokens conserved, bit for bit
    // Each exchange moves the rows routed, no more: this rank's sent rows out, then its received
    // rows back (the counters' all-to-all bytes).
    const auto d = world.counters() - before;
    std::int64_t rows = 0;
    for (std::int64_t e = 0; e < E; ++e) rows += mine[static_cast<std::size_t>(e)];
    CHECK(r.sent() == rows);
    CHECK(r.received() == first + second);
    CHECK(d.calls_of(threads::Op::all_to_all) == 2);
    CHECK(d.bytes_of(threads::Op::all_to_all) == static_cast<std::uint64_t>((rows + first + second) * w * 8));
  });
}

TEST_CASE_TEMPLATE(
    "MoeMlp with its experts over expert 2 and 4 equals one rank with either dispatcher, each moving what it says", Dsp,
    nn::AllToAllDispatch, nn::AllGatherDispatch) {
  // The Mixtral fixture (4 experts) on B = 4 samples: data 2 x expert 2, data 4 x expert 2 (two
  // expert-data ranks a group) and data 4 x expert 4 (one expert a rank). Each rank holds its
  // experts' weights only; a rank's expert gradients cover every rank's tokens sent to them.
  using L = nn::MoeMlp<double, A, Host, Dsp>;
  constexpr bool gathers = std::same_as<Dsp, nn::AllGatherDispatch>;
  const Fixture f("mixtral");
  const std::int64_t B = 4, T = f.N / 4;
  struct Run {
    std::vector<double> y, dx, aux;
    std::vector<std::vector<double>> grads;  // every parameter, as this rank holds it
    int expert = 0;
  };
  auto run = [&](int data, int ep) {
    std::vector<Run> out(static_cast<std::size_t>(data));
    run_threads(data, [&](ThreadComm& world) {
      Host h;
      Mesh mesh{world, {.data = data, .expert = ep}};
      L m(h, f.C, f.options(), mesh.spread(), 0, 1, 0.1, 0.1);
      CHECK(m.gate_up.value.local_shape()[0] == f.E / ep);
      f.load(m, ep, mesh.coord().expert);
      const std::int64_t Bl = B / data, first = mesh.coord().data * Bl * T * f.C, N = Bl * T;
      auto x = X::empty(h, {B, T, f.C}, mesh.spread(), Category::activations);
      auto dy = X::empty(h, {B, T, f.C}, mesh.spread(), Category::activations);
      const auto xs = f.file.read("x"), g = f.file.read("dy");
      std::copy_n(xs.begin() + first, x.numel(), x.data());
      std::copy_n(g.begin() + first, dy.numel(), dy.data());
      auto& group = mesh.comm(Axis::expert);
      CHECK(group.size() == ep);
      const auto before = group.counters();
      typename L::Ctx ctx;
      const auto y = m.forward(ctx, x, mesh);
      const std::int64_t sent = ctx.M, got = ctx.offsets.back();
      const auto dx = m.backward(ctx, dy, mesh);
      const auto d = group.counters() - before;
      const auto bytes = [](std::int64_t n) { return static_cast<std::uint64_t>(n); };
      if (ep > 1 && gathers) {
        // Gathered: x, the indices and weights, dy (ep N rows each); summed and scattered: the
        // outputs, the weights' and the rows' gradients. No all-to-all.
        CHECK(d.calls_of(threads::Op::all_gather) == 4);
        CHECK(d.bytes_of(threads::Op::all_gather) == bytes(ep * N * (2 * f.C * 8 + f.k * 4 + f.k * 8)));
        CHECK(d.calls_of(threads::Op::reduce_scatter) == 3);
        CHECK(d.bytes_of(threads::Op::reduce_scatter) == bytes(ep * N * (2 * f.C * 8 + f.k * 8)));
        CHECK(d.calls_of(threads::Op::all_to_all) == 0);
      } else if (ep > 1) {
        // The counts (E int64), then the rows sent and the rows got, forward and backward: exactly
        // the rows routed.
        CHECK(d.calls_of(threads::Op::all_to_all) == 5);
        CHECK(d.bytes_of(threads::Op::all_to_all) == bytes(f.E * 8 + 2 * (sent + got) * f.C * 8));
        CHECK(d.calls_of(threads::Op::all_gather) == 0);
      }
      Run& r = out[static_cast<std::size_t>(mesh.coord().data)];
      r.y.assign(y.data(), y.data() + y.numel());
      r.dx.assign(dx.data(), dx.data() + dx.numel());
      r.aux = {m.last_aux, m.last_z, m.last_load};
      r.expert = mesh.coord().expert;
      m.for_each_param("", [&](const std::string&, auto& p) { r.grads.push_back(grads(p)); });
    });
    return out;
  };
  const auto one = run(1, 1);
  for (const auto [data, ep] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 4}}) {
    INFO(Dsp::name(), ": data ", data, " x expert ", ep);
    const auto many = run(data, ep);
    std::vector<double> y, dx;
    for (const Run& r : many) {
      y.insert(y.end(), r.y.begin(), r.y.end());
      dx.insert(dx.end(), r.dx.begin(), r.dx.end());
      CHECK(relative(r.aux, one[0].aux) <= 1e-14);  // the same sums over 4 ranks in another order
    }
    CHECK(relative(y, one[0].y) <= 1e-14);
    CHECK(relative(dx, one[0].dx) <= 1e-14);
    for (std::size_t p = 0; p < one[0].grads.size(); ++p)
      CHECK_MESSAGE(relative(expert_grads(many, p, ep), one[0].grads[p]) <= 1e-13, "parameter ", p);
  }
}

TEST_CASE_TEMPLATE("MoeMlp with FP8 experts: each expert casts its own block, and expert 2 and 4 equal one rank", Dsp,
                   nn::AllToAllDispatch, nn::AllGatherDispatch) {
  // An f32 layer whose experts' GEMMs read float8 casts (rowwise, e5m2 gradients; the router's GEMMs
  // stay f32), on the Mixtral fixture's weights and B = 4 samples. On one rank its output is between
  // 1e-4 and 0.1 away from the f32 layer's (the casts' rounding, so the GEMMs did cast). Over expert 2
  // and 4 each expert's block holds the same rows in the same order as on one rank (every data rank's
  // tokens routed to it), so it casts alike: y, dx and every gradient within 1e-6 of one rank (f32
  // sums of the combine and the router in another order; the same layout in f64 holds to 1e-14 above).
  using G8 = fp8::Gemms<fp8::scaling::Rowwise>;
  using L8 = nn::MoeMlp<float, A, Host, Dsp, nn::ExpertTensor::whole, G8>;
  using L32 = nn::MoeMlp<float, A, Host, Dsp>;
  using XF = Tensor<float, A, Host>;
  const Fixture f("mixtral");
  REQUIRE(f.S == 0);  // a shared expert casts each rank's own tokens (as a dense MLP does): not this check's
  const std::int64_t B = 4, T = f.N / 4;
  struct Run {
    std::vector<double> y, dx;
    std::vector<std::vector<double>> grads;
    int expert = 0;
  };
  const auto put = [](auto& p, const std::vector<double>& v) {
    REQUIRE(static_cast<std::size_t>(p.value.numel()) == v.size());
    for (std::size_t i = 0; i < v.size(); ++i) p.value.data()[i] = static_cast<float>(v[i]);
  };
  const auto doubles = [](const float* p, std::int64_t n) { return std::vector<double>(p, p + n); };
  auto run = [&]<class L>(std::type_identity<L>, int data, int ep) {
    std::vector<Run> out(static_cast<std::size_t>(data));
    run_threads(data, [&](ThreadComm& world) {
      Host h;
      Mesh mesh{world, {.data = data, .expert = ep}};
      L m(h, f.C, f.options(), mesh.spread(), 0, 1, 0.1, 0.1);
      put(m.router, f.file.read("router"));
      put(m.gate_up, slice(interleave(f.file.read("gate_up"), f.E, f.H, f.C), ep, mesh.coord().expert));
      put(m.down, slice(f.file.read("down"), ep, mesh.coord().expert));
      const std::int64_t Bl = B / data, first = mesh.coord().data * Bl * T * f.C;
      auto x = XF::empty(h, {B, T, f.C}, mesh.spread(), Category::activations);
      auto dy = XF::empty(h, {B, T, f.C}, mesh.spread(), Category::activations);
      const auto xs = f.file.read("x"), g = f.file.read("dy");
      for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(xs[first + i]);
      for (std::int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] = static_cast<float>(g[first + i]);
      typename L::Ctx ctx;
      const auto y = m.forward(ctx, x, mesh);
      const auto dx = m.backward(ctx, dy, mesh);
      Run& r = out[static_cast<std::size_t>(mesh.coord().data)];
      r.y = doubles(y.data(), y.numel());
      r.dx = doubles(dx.data(), dx.numel());
      r.expert = mesh.coord().expert;
      m.for_each_param("",
                       [&](const std::string&, auto& p) { r.grads.push_back(doubles(p.grad.data(), p.grad.numel())); });
    });
    return out;
  };
  const auto one = run(std::type_identity<L8>{}, 1, 1);
  const double cast = relative(one[0].y, run(std::type_identity<L32>{}, 1, 1)[0].y);
  MESSAGE("FP8 experts (rowwise) against f32's, one rank: output ", cast, " relative");
  CHECK(cast > 1e-4);
  CHECK(cast < 0.1);
  for (const auto [data, ep] : {std::pair{2, 2}, std::pair{4, 4}}) {
    INFO(Dsp::name(), ": data ", data, " x expert ", ep);
    const auto many = run(std::type_identity<L8>{}, data, ep);
    std::vector<double> y, dx;
    for (const Run& r : many) {
      y.insert(y.end(), r.y.begin(), r.y.end());
      dx.insert(dx.end(), r.dx.begin(), r.dx.end());
    }
    CHECK(relative(y, one[0].y) <= 1e-6);
    CHECK(relative(dx, one[0].dx) <= 1e-6);
    for (std::size_t p = 0; p < one[0].grads.size(); ++p)
      CHECK_MESSAGE(relative(expert_grads(many, p, ep), one[0].grads[p]) <= 1e-6, "parameter ", p);
  }
}

TEST_CASE("an FP8 expert's overflowing operand is refused naming the expert and its GEMM") {
  using L8 =
      nn::MoeMlp<float, A, Host, nn::AllToAllDispatch, nn::ExpertTensor::whole, fp8::Gemms<fp8::scaling::Tensorwise>>;
  const Fixture f("mixtral");
  run_threads(1, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {}};
    L8 m(h, f.C, f.options(), mesh.spread(), 0, 1, 0.1, 0.1);
    for (std::int64_t i = 0; i < m.down.value.numel(); ++i) m.down.value.data()[i] = 0.01f;
    m.down.value.data()[2 * f.C * f.H + 5] = std::numeric_limits<float>::infinity();  // expert 2's
    auto x = Tensor<float, A, Host>::empty(h, {1, f.N, f.C}, mesh.spread(), Category::activations);
    const auto xs = f.file.read("x");
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(xs[i]);
    typename L8::Ctx ctx;
    CHECK_THROWS_WITH_AS(m.forward(ctx, x, mesh),
                         doctest::Contains("MoeMlp's expert 2's down GEMM, its weight: the tensor holds an infinite "
                                           "or NaN value"),
                         Error);
  });
}

TEST_CASE("MoeMlp refuses bad options by name") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    auto make = [&](nn::MoeOptions o) { Moe(h, 8, o, mesh.spread(), 0, 1, 0.1, 0.1); };
    CHECK_THROWS_WITH_AS(make({.experts = 4, .top_k = 5, .hidden = 4}),
                         "MoeMlp: top-k 5 of 4 experts; choose from 1 to the experts", Error);
    CHECK_THROWS_WITH_AS(make({.experts = 513, .top_k = 2, .hidden = 4}), "MoeMlp: 513 experts; use 1 to 512 experts",
                         Error);
    CHECK_THROWS_WITH_AS(make({.experts = 8, .top_k = 2, .hidden = 4, .groups = 3}),
                         "MoeMlp: 8 experts in 3 groups; use 1 group, or up to 64 groups that divide the experts into "
                         "groups of 2 or more",
                         Error);
    CHECK_THROWS_WITH_AS(make({.experts = 8, .top_k = 2, .hidden = 4, .groups = 8}),
                         "MoeMlp: 8 experts in 8 groups; use 1 group, or up to 64 groups that divide the experts into "
                         "groups of 2 or more",
                         Error);
    CHECK_THROWS_WITH_AS(make({.experts = 8, .top_k = 3, .hidden = 4, .groups = 4, .top_groups = 1}),
                         "MoeMlp: top-k 3 from the top 1 of 4 groups of 2 experts; choose from 1 to the groups, enough "
                         "of them to hold the top-k experts",
                         Error);
    CHECK_THROWS_WITH_AS(make({.experts = 8, .top_k = 2, .hidden = 4, .groups = 4, .top_groups = 5}),
                         "MoeMlp: top-k 2 from the top 5 of 4 groups of 2 experts; choose from 1 to the groups, enough "
                         "of them to hold the top-k experts",
                         Error);
    CHECK_THROWS_WITH_AS(make({.experts = 4, .top_k = 2, .hidden = 4, .capacity_factor = -1}),
                         "MoeMlp: a capacity factor of -1; use a positive capacity factor, or 0 for dropless routing",
                         Error);
    CHECK_THROWS_WITH_AS(Moe(h, 8, {.experts = 6, .top_k = 2, .hidden = 4}, Spread{.expert_degree = 4}, 0, 1, 0.1, 0.1),
                         "MoeMlp: 6 experts over an expert degree of 4; choose an expert degree that divides the 6 "
                         "experts",
                         Error);
    CHECK_THROWS_WITH_AS(make({.experts = 4, .top_k = 2, .hidden = 4, .z_coef = 0.01, .score = nn::Score::sigmoid}),
                         "MoeMlp: a z-loss (coefficient 0.01) with sigmoid scores; train sigmoid routers without the "
                         "z-loss (z coefficient 0), as DeepSeek-V3 does",
                         Error);
    CHECK_THROWS_WITH_AS(make({.experts = 4, .top_k = 2, .hidden = 4, .scale = 0}),
                         "MoeMlp: a routing scale of 0; scale the chosen weights by a positive factor (1: none)",
                         Error);
    CHECK_THROWS_WITH_AS(make({.experts = 4, .top_k = 2, .hidden = 4, .expert_bias = true, .bias_rate = -1e-3}),
                         "MoeMlp: an expert-bias rate of -0.001; use a rate of 0 or more (DeepSeek-V3: 1e-3; 0 holds "
                         "the bias fixed)",
                         Error);
    CHECK_THROWS_WITH_AS(make({.experts = 4, .top_k = 2, .hidden = 0}),
                         "MoeMlp: width 8, expert width 0, shared width 0; give the layer positive widths (a shared "
                         "width of 0 for none)",
                         Error);
  });
}

TEST_CASE("MoeMlp in bf16 on the host: the Mixtral fixture's output and gradients within 3e-2") {
  // bf16 weights, inputs and activations, the router's probabilities and the GEMMs' sums in float:
  // against the f64 reference of the unrounded values, so the inputs' rounding (2^-9 relative)
  // carries through two GEMMs and the SwiGLU.
  using MoeB = nn::MoeMlp<bf16, A, Host>;
  using XB = Tensor<bf16, A, Host>;
  const Fixture f("mixtral");
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    MoeB m(h, f.C, f.options(), mesh.spread(), 0, 1, 0.1, 0.1);
    auto put = [](auto& p, const std::vector<double>& v) {
      REQUIRE(static_cast<std::size_t>(p.value.numel()) == v.size());
      for (std::size_t i = 0; i < v.size(); ++i) p.value.data()[i] = narrow<bf16>(static_cast<float>(v[i]));
    };
    put(m.router, f.file.read("router"));
    put(m.gate_up, interleave(f.file.read("gate_up"), f.E, f.H, f.C));
    put(m.down, f.file.read("down"));
    auto x = XB::empty(h, {1, f.N, f.C}, mesh.spread(), Category::activations);
    auto dy = XB::empty(h, {1, f.N, f.C}, mesh.spread(), Category::activations);
    const auto xs = f.file.read("x"), g = f.file.read("dy");
    for (std::size_t i = 0; i < xs.size(); ++i) x.data()[i] = narrow<bf16>(static_cast<float>(xs[i]));
    for (std::size_t i = 0; i < g.size(); ++i) dy.data()[i] = narrow<bf16>(static_cast<float>(g[i]));
    MoeB::Ctx ctx;
    const auto y = m.forward(ctx, x, mesh);
    const auto dx = m.backward(ctx, dy, mesh);
    auto doubles = []<class E>(const E* p, std::int64_t n) {  // bf16 activations, float gradients
      std::vector<double> v(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(widen(p[i]));
      return v;
    };
    const double ey = relative(doubles(y.data(), y.numel()), f.file.read("y"));
    const double ex = relative(doubles(dx.data(), dx.numel()), f.file.read("grad.x"));
    const double er = relative(doubles(m.router.grad.data(), m.router.grad.numel()), f.file.read("grad.router"));
    const double eu = relative(doubles(m.gate_up.grad.data(), m.gate_up.grad.numel()),
                               interleave(f.file.read("grad.gate_up"), f.E, f.H, f.C));
    const double ed = relative(doubles(m.down.grad.data(), m.down.grad.numel()), f.file.read("grad.down"));
    CHECK(ey <= 3e-2);
    CHECK(ex <= 3e-2);
    CHECK(er <= 3e-2);
    CHECK(eu <= 3e-2);
    CHECK(ed <= 3e-2);
    CHECK(std::abs(m.last_aux - f.file.read("aux")[0]) <= 3e-2 * f.file.read("aux")[0]);
    MESSAGE("bf16: output ", ey, ", dx ", ex, ", router ", er, ", gate_up ", eu, ", down ", ed, " relative");
  });
}

TEST_CASE_TEMPLATE("MoeMlp with its experts split over tensor 2 and 4 equals the whole layer on one rank", Dsp,
                   nn::AllToAllDispatch, nn::AllGatherDispatch) {
  // Expert-tensor parallelism (ExpertTensor::sharded): each expert's hidden features and the shared
  // expert's split over the tensor ranks, between CopyToTensor and ReduceFromTensor as a Megatron
  // MLP. Against the whole layer on one rank (the same weights: every mesh draws them alike), with a
  // capacity, a shared expert and the z-loss, and with sigmoid scores, an expert bias and a scale.
  using Split = nn::MoeMlp<double, A, Host, Dsp, nn::ExpertTensor::sharded>;
  using Branch = nn::Sequential<nn::CopyToTensor, Split, nn::ReduceFromTensor>;
  const std::int64_t B = 2, T = 5, C = 6;
  struct Run {
    std::vector<double> y, dx;
    std::vector<std::vector<double>> grads;  // gathered whole
    double aux = 0;
    threads::Counters fwd, bwd;
  };
  const auto run = [&]<class L>(int tp, auto make) {
    Run out;
    std::mutex mu;
    run_threads(tp, [&](ThreadComm& world) {
      Host h;
      Mesh mesh{world, {.tensor = tp}};
      L layer = make(h, mesh.spread());
      auto x = X::empty(h, {B, T, C}, mesh.spread(), Category::activations);
      auto dy = X::empty(h, {B, T, C}, mesh.spread(), Category::activations);
      set({x.data(), static_cast<std::size_t>(x.numel())}, test::normals(static_cast<std::size_t>(x.numel()), 71));
      set({dy.data(), static_cast<std::size_t>(dy.numel())}, test::normals(static_cast<std::size_t>(dy.numel()), 72));
      typename L::Ctx ctx;
      const auto c0 = mesh.tensor().counters();
      const auto y = layer.forward(ctx, x, mesh);
      const auto c1 = mesh.tensor().counters();
      const auto dx = layer.backward(ctx, dy, mesh);
      const auto c2 = mesh.tensor().counters();
      Run r{{y.data(), y.data() + y.numel()}, {dx.data(), dx.data() + dx.numel()}, {}, 0, c1 - c0, c2 - c1};
      layer.for_each_param("", [&](const std::string&, auto& p) {
        const auto g = redistribute<Replicated>(p.grad, mesh);
        r.grads.emplace_back(g.data(), g.data() + g.numel());
      });
      nn::for_each_layer(layer, [&](auto& leaf) {
        if constexpr (nn::Routes<std::remove_cvref_t<decltype(leaf)>>) r.aux = leaf.last_aux;
      });
      if (world.rank() != 0) return;
      std::lock_guard lock(mu);
      out = std::move(r);
    });
    return out;
  };
  const nn::MoeOptions capacity = {.experts = 4,
                                   .top_k = 2,
                                   .hidden = 8,
                                   .renormalise = false,
                                   .capacity_factor = 1.0,
                                   .aux_coef = 0.3,
                                   .z_coef = 0.05,
                                   .shared_hidden = 4};
  const nn::MoeOptions sigmoid = {
      .experts = 4, .top_k = 2, .hidden = 8, .score = nn::Score::sigmoid, .scale = 2.5, .expert_bias = true};
  for (const auto& o : {capacity, sigmoid}) {
    const Run one =
        run.template operator()<Moe>(1, [&](Host& h, const Spread& s) { return Moe(h, C, o, s, 0, 4, 0.5, 0.5); });
    for (int tp : {2, 4}) {
      INFO(Dsp::name(), ", tensor ", tp, o.expert_bias ? ", sigmoid scores and a bias" : ", a capacity");
      const Run r = run.template operator()<Branch>(tp, [&](Host& h, const Spread& s) {
        Split m(h, C, o, s, 0, 4, 0.5, 0.5);
        CHECK(m.gate_up.value.local_shape() == Shape{4, 2 * 8 / tp, C});  // each expert's share of 8 features
        CHECK(m.down.value.local_shape() == Shape{4, C, 8 / tp});
        return Branch({}, std::move(m), {});
      });
      // The same products, each hidden feature's on one rank, summed over the ranks: about 1e-16.
      CHECK(relative(r.y, one.y) <= 1e-13);
      CHECK(relative(r.dx, one.dx) <= 1e-13);
      CHECK(r.aux == one.aux);  // the same routing statistics on every tensor rank: exact
      REQUIRE(r.grads.size() == one.grads.size());
      for (std::size_t p = 0; p < one.grads.size(); ++p)
        CHECK_MESSAGE(relative(r.grads[p], one.grads[p]) <= 1e-13, "parameter ", p);
      // On tensor: forward ReduceFromTensor's all-reduce; backward the weights' gradients' (N k
      // doubles) and CopyToTensor's.
      CHECK(r.fwd.calls_of(threads::Op::all_reduce) == 1);
      CHECK(r.bwd.calls_of(threads::Op::all_reduce) == 2);
      CHECK(r.bwd.bytes_of(threads::Op::all_reduce) == static_cast<std::uint64_t>((B * T * o.top_k + B * T * C) * 8));
      // describe's rows (nn/comm_walk.hpp) say the same of the tensor axis.
      Host h;
      const Spread s{.tensor_degree = tp};
      std::vector<nn::CommRow> rows;
      nn::layer_comm_rows(rows, "moe", Branch({}, Split(h, C, o, s, 0, 4, 0.5, 0.5), {}), Shape{B, T, C}, s, 8);
      std::int64_t fwd = 0, bwd = 0, bwd_bytes = 0;
      for (const auto& row : rows) {
        for (const auto& st : row.forward) fwd += st.axis == Axis::tensor && st.collective == Collective::all_reduce;
        for (const auto& st : row.backward)
          if (st.axis == Axis::tensor && st.collective == Collective::all_reduce) ++bwd, bwd_bytes += st.bytes_in;
      }
      CHECK(fwd == 1);
      CHECK(bwd == 2);
      CHECK(bwd_bytes == (B * T * o.top_k + B * T * C) * 8);
    }
  }
}

TEST_CASE("MoeMlp refuses experts it cannot split over the tensor ranks, by name") {
  run_threads(2, [](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {.tensor = 2}};
    using Split = nn::MoeMlp<double, A, Host, nn::AllToAllDispatch, nn::ExpertTensor::sharded>;
    CHECK_THROWS_WITH_AS(
        Split(h, 6, {.experts = 4, .top_k = 2, .hidden = 5}, mesh.spread(), 0, 1, 0.1, 0.1),
        doctest::Contains("experts of width 5 and a shared width of 0 split over a tensor degree of 2"), Error);
  });
}
