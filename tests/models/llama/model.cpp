// The Llama family (models/llama/model.hpp): its layers (RMSNorm, grouped-query attention with
// rotary positions and llama3 scaling, SwiGLU) against finite differences in double, the attention
// core and rotation against direct loops; the whole model at tensor 2 (with and without SP), pipe 2
// (1F1B, ZB-H1), data 2 (every strategy) and under each recompute policy equal to one rank within
// 1e-12 in double; a checkpoint resumed on another mesh; configurations refused by name.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <numbers>
#include <type_traits>

#include "checkpoint/support.hpp"
#include "support/gradcheck.hpp"
#include "support/train_steps.hpp"
#include "weft/checkpoint/checkpoint.hpp"
#include "weft/core/float8_gemms.hpp"
#include "weft/models/llama/model.hpp"
#include "weft/train/flops.hpp"

using namespace weft;
using namespace weft::pipeline;

namespace {

// 4 layers (pipe 2 takes 2 each), 4 heads over 2 key-value heads (tensor 2 holds one group each),
// rope scaling on with an original context short enough that the three frequency bands all occur.
const llama::Config kConfig{
    .vocab = 33,
    .seq = 8,
    .layers = 4,
    .heads = 4,
    .kv_heads = 2,
    .width = 16,
    .hidden = 24,
    .rope = {.theta = 500, .factor = 4, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 64},
    .norm_eps = 1e-5,
    .seed = 3,
    .init_std = 0.2};
constexpr std::int64_t kMicro = 4;
constexpr int kM = 4;

// A layer's input and parameter gradients against finite differences of <y, R> (1e-6: the
// five-point rule's error, support/gradcheck.hpp).
template <class Layer, class X>
void check_gradients(Layer& layer, X& x, Host& h, const Spread& s, const Shape& out) {
  const auto R = test::normals(static_cast<std::size_t>(out.numel()), 6);
  auto loss = [&] {
    typename Layer::Ctx c;
    auto y = layer.forward(c, x);
    return test::dot(std::vector<double>(y.data(), y.data() + y.numel()), R);
  };
  typename Layer::Ctx c;
  auto y0 = layer.forward(c, x);
  REQUIRE(y0.numel() == out.numel());
  auto dy = Tensor<double, typename Layer::GradOut, Host>::empty(h, out, s);  // with the layout backward takes
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy[i] = R[static_cast<std::size_t>(i)];
  auto dx = layer.backward(c, dy);
  const std::vector<double> dxv(dx.data(), dx.data() + dx.numel());
  CHECK(test::gradcheck(std::span<double>(x.data(), static_cast<std::size_t>(x.numel())), std::span<const double>(dxv),
                        loss)
            .worst <= 1e-6);
  layer.for_each_param("p", [&](const std::string& n, auto& p) {
    const std::vector<double> g(p.grad.data(), p.grad.data() + p.grad.numel());
    CHECK_MESSAGE(test::gradcheck(std::span<double>(p.value.data(), static_cast<std::size_t>(p.value.numel())),
                                  std::span<const double>(g), loss)
                          .worst <= 1e-6,
                  n);
  });
}

template <class X>
void fill(X& x, std::uint64_t stream, double scale = 1) {
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = scale * weft::normal(stream, 0, static_cast<std::uint64_t>(i));
}

}  // namespace

TEST_CASE("Llama's layers match finite differences in double") {
  Host h;
  const Spread s{};
  SUBCASE("RmsNorm") {
    auto x = Tensor<double, nn::act::Full, Host>::empty(h, {2, 3, 8}, s);
    fill(x, 4);
    nn::RmsNorm<double, nn::act::Full> norm(h, 8, s, 5, 9, 1e-5);
    for (std::int64_t i = 0; i < 8; ++i)
      norm.weight.value[i] = 1 + 0.1 * weft::normal(5, 1, static_cast<std::uint64_t>(i));
    check_gradients(norm, x, h, s, x.global_shape());
  }
  SUBCASE("SwiGlu") {
    auto a = Tensor<double, nn::act::Features, Host>::empty(h, {2, 3, 8}, s);
    fill(a, 7, 2);
    nn::SwiGlu<double> glu;
    check_gradients(glu, a, h, s, {2, 3, 4});
  }
  SUBCASE("grouped-query attention with rotary positions (llama3 scaling), 4 heads over 2 and over 1 key-value heads") {
    for (std::int64_t kv : {2, 1, 4}) {
      CAPTURE(kv);
      auto x = Tensor<double, nn::act::Full, Host>::empty(h, {2, 5, 16}, s);
      fill(x, 8);
      nn::GroupedQueryAttention<double> attn(h, 16, 4, kv, kConfig.rope, s, 1, 3, 0.3, 0.3);
      check_gradients(attn, x, h, s, x.global_shape());
    }
  }
}

TEST_CASE("grouped attention and the rotation equal direct loops of their definitions") {
  // Against the formulas written out, one head at a time, in double (1e-13: the same few products
  // in another order).
  Host h;
  const std::int64_t B = 2, Tn = 6, G = 2, g = 3, hd = 4, H = G * g, row = G * (g + 2) * hd;
  std::vector<double> qkv(static_cast<std::size_t>(B * Tn * row));
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = weft::normal(11, 0, i);
  const ops::Rope rope{
      .theta = 100, .factor = 2, .low_freq_factor = 1, .high_freq_factor = 2, .original_max_positions = 8};
  auto rotated = qkv;
  ops::Rotary<Host>::forward(h, rotated.data(), B, Tn, G, g, hd, rope, 3);
  double worst = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < Tn; ++t)
      for (std::int64_t j = 0; j < G * (g + 2); ++j)
        for (std::int64_t i = 0; i < hd / 2; ++i) {
          const std::size_t at = static_cast<std::size_t>((b * Tn + t) * row + j * hd + i), half = hd / 2;
          const bool is_v = j % (g + 2) == g + 1;
          const double a = static_cast<double>(3 + t) * ops::rope_inv_freq(i, hd, rope);
          const double x0 = qkv[at], x1 = qkv[at + half];
          const double y0 = is_v ? x0 : x0 * std::cos(a) - x1 * std::sin(a);
          const double y1 = is_v ? x1 : x1 * std::cos(a) + x0 * std::sin(a);
          worst = test::worse(test::worse(worst, std::abs(rotated[at] - y0)), std::abs(rotated[at + half] - y1));
        }
  CHECK(worst <= 1e-13);
  auto back = rotated;  // the backward is the inverse rotation: the input again
  ops::Rotary<Host>::backward(h, back.data(), B, Tn, G, g, hd, rope, 3);
  double inv = 0;
  for (std::size_t i = 0; i < qkv.size(); ++i) inv = test::worse(inv, std::abs(back[i] - qkv[i]));
  CHECK(inv <= 1e-14);

  // llama3 frequencies (hd 4: f_0 = 1, wavelength 2 pi; f_1 = 0.1, wavelength 20 pi), bands at
  // original / low and original / high. Here 4 < 2 pi < 8: f_0 between, interpolated with
  // s = 8 / (2 pi) - 1 to (1 - s) / 2 + s = 2 / pi; 20 pi > 8: f_1 divided by the factor.
  CHECK(ops::rope_inv_freq(0, hd, rope) == doctest::Approx(2 / std::numbers::pi).epsilon(1e-14));
  CHECK(ops::rope_inv_freq(1, hd, rope) == doctest::Approx(0.05).epsilon(1e-14));
  auto wide = rope;  // bands at 16 and 8: 2 pi < 8 is kept
  wide.original_max_positions = 16;
  CHECK(ops::rope_inv_freq(0, hd, wide) == doctest::Approx(1.0).epsilon(1e-14));
  CHECK(ops::rope_inv_freq(1, hd, wide) == doctest::Approx(0.05).epsilon(1e-14));
  wide.factor = 0;  // no scaling: theta^(-2i/hd)
  CHECK(ops::rope_inv_freq(1, hd, wide) == doctest::Approx(0.1).epsilon(1e-14));

  std::vector<double> out(static_cast<std::size_t>(B * Tn * H * hd)), probs(static_cast<std::size_t>(B * H * Tn * Tn));
  ops::Attention<Host>::forward(h, out.data(), probs.data(), qkv.data(), B, Tn, H, hd, g);
  double err = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t hh = 0; hh < H; ++hh) {
      const std::int64_t grp = hh / g;
      auto q = [&](std::int64_t t, std::int64_t d) {
        return qkv[static_cast<std::size_t>((b * Tn + t) * row + (grp * (g + 2) + hh % g) * hd + d)];
      };
      auto k = [&](std::int64_t t, std::int64_t d) {
        return qkv[static_cast<std::size_t>((b * Tn + t) * row + (grp * (g + 2) + g) * hd + d)];
      };
      auto v = [&](std::int64_t t, std::int64_t d) {
        return qkv[static_cast<std::size_t>((b * Tn + t) * row + (grp * (g + 2) + g + 1) * hd + d)];
      };
      for (std::int64_t i = 0; i < Tn; ++i) {
        std::vector<double> p(static_cast<std::size_t>(i + 1));
        double z = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double sdot = 0;
          for (std::int64_t d = 0; d < hd; ++d) sdot += q(i, d) * k(j, d);
          z += (p[static_cast<std::size_t>(j)] = std::exp(sdot / 2.0));  // 1 / sqrt(hd) = 1/2
        }
        for (std::int64_t d = 0; d < hd; ++d) {
          double o = 0;
          for (std::int64_t j = 0; j <= i; ++j) o += p[static_cast<std::size_t>(j)] / z * v(j, d);
          err = test::worse(err, std::abs(out[static_cast<std::size_t>(((b * Tn + i) * H + hh) * hd + d)] - o));
        }
      }
    }
  CHECK(err <= 1e-13);
}

TEST_CASE(
    "Llama at tensor 2 (with and without SP), pipe 2 (1F1B, ZB-H1), data 2 (every strategy) and each recompute "
    "policy equals one rank within 1e-12 in double") {
  // 1e-12: the same sums in another order; double leaves about 1e-15 per operation.
  auto run = [&]<bool SP, class Sched, class Strategy, class R = recompute::None>(int pipe, int tensor, int data) {
    return test::train_steps<llama::Model<double, SP, R>, Sched, Strategy>(kConfig, kMicro, kM, pipe, 1, tensor, data,
                                                                           3);
  };
  const auto ref = run.template operator()<false, OneFOneB, optim::Ddp>(1, 1, 1);
  REQUIRE(ref.grads.count("layers.0.attn.qkv.weight") == 1);
  REQUIRE(ref.grads.count("layers.3.gate_up.weight") == 1);
  REQUIRE(ref.grads.count("lm_head") == 1);
  REQUIRE(ref.losses.size() == 3);
  CHECK(ref.losses[2] < ref.losses[0]);  // AdamW at 1e-2 lowers the loss on the Markov corpus
  auto compare = [&](const test::StepsRun& got, const std::string& what, bool grads) {
    for (std::size_t i = 0; i < ref.losses.size(); ++i)
      CHECK_MESSAGE(std::abs(got.losses.at(i) - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]), what, " step ", i);
    std::string where;
    if (grads) {
      const double e = test::worst_tensor(got.grads, ref.grads, where);
      CHECK_MESSAGE(e <= 1e-12, what, ": gradient of ", where, " off by ", e);
    }
    double diff = 0, scale = 0;
    for (const auto& [name, v] : ref.values)
      for (std::size_t i = 0; i < v.size(); ++i) {
        diff = test::worse(diff, std::fabs(got.values.at(name).at(i) - v[i]));
        scale = std::max(scale, std::fabs(v[i]));
      }
    CHECK_MESSAGE(diff / scale <= 1e-12, what, ": parameters off by ", diff / scale);
    MESSAGE(what, ": parameters after 3 steps within ", diff / scale);
  };
  compare(run.template operator()<false, OneFOneB, optim::Ddp>(1, 2, 1), "tensor 2", true);
  compare(run.template operator()<true, OneFOneB, optim::Ddp>(1, 2, 1), "tensor 2, SP", true);
  compare(run.template operator()<false, OneFOneB, optim::Ddp>(2, 1, 1), "pipe 2, 1F1B", true);
  compare(run.template operator()<false, ZeroBubbleH1, optim::Ddp>(2, 1, 1), "pipe 2, ZB-H1", true);
  compare(run.template operator()<false, OneFOneB, optim::Ddp>(1, 1, 2), "data 2, DDP", true);
  compare(run.template operator()<false, OneFOneB, optim::Zero1>(1, 1, 2), "data 2, ZeRO-1", false);
  compare(run.template operator()<false, OneFOneB, optim::Fsdp>(1, 1, 2), "data 2, FSDP", false);
  compare(run.template operator()<false, OneFOneB, optim::Ddp, recompute::Full>(1, 1, 1), "Full recompute", true);
  compare(run.template operator()<true, OneFOneB, optim::Ddp, recompute::Selective>(1, 2, 1), "tensor 2, SP, Selective",
          true);
}

namespace {
template <class P, bool SP>
using Llama = llama::Model<P, SP, recompute::None, Host>;
}  // namespace

TEST_CASE("a Llama checkpoint saved on data 2 x tensor 2 (SP, ZeRO-1) resumes on pipe 2 (DDP) exactly") {
  using test::ckpt_run;
  using test::RunPlan;
  const auto dir = test::scratch("llama");
  const auto whole =
      ckpt_run<double, optim::Ddp, false, checkpoint::Sharded, Llama>({}, RunPlan::fresh("", 6), kConfig, kMicro);
  const auto first = ckpt_run<double, optim::Zero1, true, checkpoint::Sharded, Llama>(
      {.data = 2, .tensor = 2}, RunPlan::fresh(dir, 3), kConfig, kMicro);
  const auto step = dir + "/step_00000003";
  REQUIRE(std::filesystem::exists(step + "/manifest.json"));
  const auto rest = ckpt_run<double, optim::Ddp, false, checkpoint::Sharded, Llama>(
      {.pipe = 2}, RunPlan::resumed(step, "", 6), kConfig, kMicro);
  REQUIRE(first.size() == 3);
  REQUIRE(rest.size() == 3);
  // 1e-12: the same steps on other meshes (other sums' orders); the resume itself is exact.
  for (std::size_t i = 0; i < 6; ++i) {
    const double got = i < 3 ? first[i] : rest[i - 3];
    CHECK_MESSAGE(std::abs(got - whole[i]) <= 1e-12 * whole[i], "step ", i + 1, ": ", got, " against ", whole[i]);
  }
  // A Llama that differs in one field (the rotary base) refuses it, naming the field.
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    auto other = kConfig;
    other.rope.theta = 10000;
    llama::Model<double> model(h, other, mesh.spread(), kMicro);
    auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{}, mesh);
    CHECK_THROWS_WITH_AS(checkpoint::load(step, model, dp, mesh), doctest::Contains("rope_theta_x1e6"), Error);
  });
  std::filesystem::remove_all(dir);
}

TEST_CASE("Llama's FLOPs per token: the closed form equals what its layers declare") {
  for (const bool tied : {false, true})
    for (const int pipe : {1, 2})
      run_threads(pipe, [&](ThreadComm& world) {
        Host h;
        Mesh mesh{world, {.pipe = pipe}};
        const auto part = Partition::even(pipe, 1, kConfig.layers);
        auto c = kConfig;
        c.tied = tied;
        // 6 (V C (untied: twice) + L (2 C^2 + 2 C KV hd + 3 C F)) + 12 L C T, in closed form
        const double want =
            6 * (33.0 * 16 * (tied ? 1 : 2) + 4 * (2 * 256 + 2 * 16 * 8 + 3 * 16 * 24)) + 12 * 4 * 16 * 8;
        CHECK(llama::flops_per_token(c) == want);
        double got = 0;
        if (tied) {
          llama::Model<double, false, recompute::None, Host, true> m(h, c, mesh.spread(), kMicro,
                                                                     part.placement(mesh.coord().pipe));
          got = train::declared_flops_per_token(m, mesh);
        } else {
          llama::Model<double> m(h, c, mesh.spread(), kMicro, part.placement(mesh.coord().pipe));
          got = train::declared_flops_per_token(m, mesh);
        }
        CHECK(got == want);
      });
}

TEST_CASE("Llama refuses, naming the values, a mesh or configuration it cannot run") {
  Host h;
  auto refused = [&](const llama::Config& c, const Spread& s, const std::string& what) {
    try {
      llama::Model<double> m(h, c, s, 4);
      FAIL("no error for ", what);
    } catch (const Error& e) { CHECK_MESSAGE(std::string(e.what()).find(what) != std::string::npos, e.what()); }
  };
  auto c = kConfig;
  refused(c, {.tensor_degree = 4}, "tensor degree 4 does not divide 2 key-value heads");
  c.kv_heads = 3;
  refused(c, {}, "3 key-value heads do not divide 4 heads");
  c = kConfig;
  c.heads = 16;  // head size 1: rotary needs pairs
  refused(c, {}, "width 16 over 16 heads is not an even head size");
  c = kConfig;
  c.tied = true;
  refused(
      c, {},
      "Llama: a configuration with tied true for a model type with Tied false; build llama::Model<..., Tied = config.tied>");
}

namespace {

// llama-tiny's shape at width 32, trained 300 AdamW steps on the Markov corpus on one rank in
// precision P: its losses (each precision trained once for the tests below).
template <class P>
const std::vector<double>& markov_losses() {
  static const std::vector<double> losses = [] {
    llama::Config c = llama::preset("llama-tiny");
    c.width = 32;
    c.hidden = 88;
    c.seq = 32;
    return test::train_steps<llama::Model<P>, OneFOneB, optim::Ddp>(c, 4, 1, 1, 1, 1, 1, 300).losses;
  }();
  return losses;
}

double mean_of_last_20(const std::vector<double>& l) {
  double s = 0;
  for (std::size_t i = l.size() - 20; i < l.size(); ++i) s += l[i];
  return s / 20;
}

}  // namespace

TEST_CASE("Llama in bf16 mixed precision trains as f32 does: 300 host steps end within 0.05 nats") {
  // The mean of the last 20 losses of each. 0.05 nats: bf16 rounds activations to 8 bits (about
  // 0.4%), which moves a trained loss by hundredths of a nat; a wrong bf16 path (an op without a
  // widening, a lost gradient) moves it by tenths or diverges.
  const auto& f32 = markov_losses<float>();
  const auto& b16 = markov_losses<Precision<bf16, float>>();
  REQUIRE(f32.size() == 300);
  REQUIRE(b16.size() == 300);
  CHECK(mean_of_last_20(f32) < f32[0] - 1.0);  // it learned: the corpus's entropy is far below ln 64
  CHECK(std::abs(mean_of_last_20(b16) - mean_of_last_20(f32)) <= 0.05);
  MESSAGE("last 20 steps: f32 ", mean_of_last_20(f32), ", bf16 ", mean_of_last_20(b16), " (first ", f32[0], ")");
}

TEST_CASE("Llama with FP8 GEMMs trains as bf16 does: 300 host steps end within 0.05 nats, for every scaling") {
  // Precision<bf16, float, fp8::Gemms<...>> casts the operands of the attention's and the MLP's
  // GEMMs to float8 (core/float8_gemms.hpp); the rest is bf16 mixed precision, from the same weights
  // and batches. Blockwise in 8-wide blocks: the widths (32, 64, 88, 176) and 128 tokens tile.
  const auto& b16 = markov_losses<Precision<bf16, float>>();
  auto check = [&]<class G>(std::type_identity<G>) {
    const auto& f8 = markov_losses<Precision<bf16, float, G>>();
    REQUIRE(f8.size() == 300);
    MESSAGE(G::name(), ": last 20 steps ", mean_of_last_20(f8), " (bf16 ", mean_of_last_20(b16), ", first ", f8[0],
            ")");
    CHECK(mean_of_last_20(f8) < f8[0] - 1.0);  // it learned
    CHECK(std::abs(mean_of_last_20(f8) - mean_of_last_20(b16)) <= 0.05);
  };
  using namespace fp8::scaling;
  check(std::type_identity<fp8::Gemms<Tensorwise>>{});
  check(std::type_identity<fp8::Gemms<Rowwise>>{});
  check(std::type_identity<fp8::Gemms<Blockwise<8>>>{});
}
