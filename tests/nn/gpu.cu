// The training stack on the GPU against the host: attention, the tiny GPT's, the tiny Llama's, the
// tiny DiT's and a padded feature model's loss and every gradient under tensor and sequence
// parallelism (thread ranks sharing the GPU), a mixture-of-experts layer (alone, and over data 2 x
// expert 2 with either dispatcher), every data strategy, bf16
// mixed-precision training, FP8 GEMMs. Written once over the device type; every
// case exits 77 (skipped) where there is no GPU. Built by nvcc in every CUDA build, so CI compiles
// the whole stack for Cuda.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>

#include "nn/feature_spec.hpp"
#include "support/cuda_ranks.cuh"
#include "support/train_markov.hpp"
#include "weft/core/float8_gemms.hpp"
#include "weft/models/dit/model.hpp"
#include "weft/models/llama/model.hpp"
#include "weft/nn/moe.hpp"

using namespace weft;

namespace {

// Attention on B = 2 sequences of T positions, H heads of size hd in groups of g per key and value
// (H / g groups), on the GPU in T against the host in double on the same (rounded) inputs: the
// relative error of the output and of dqkv. Causal unless told; padded where lengths (B = 2) are
// given (on the GPU from a device copy of them).
template <class T>
std::pair<double, double> attention_error(std::int64_t Tn, std::int64_t hd, std::int64_t H = 2, std::int64_t g = 1,
                                          bool causal = true, const std::vector<std::int32_t>& lengths = {}) {
  Cuda& d = test::gpu();
  const std::int64_t B = 2, row = H / g * (g + 2) * hd;
  std::vector<T> qkv(static_cast<std::size_t>(B * Tn * row)), dout(static_cast<std::size_t>(B * Tn * H * hd));
  std::vector<double> qkv64(qkv.size()), dout64(dout.size());
  for (std::size_t i = 0; i < qkv.size(); ++i)
    qkv64[i] = test::to_double(qkv[i] = test::from_double<T>(weft::normal(3, 1, i)));
  for (std::size_t i = 0; i < dout.size(); ++i)
    dout64[i] = test::to_double(dout[i] = test::from_double<T>(weft::normal(3, 2, i)));
  std::vector<double> out64(dout.size()), probs64(static_cast<std::size_t>(B * H * Tn * Tn)), dqkv64(qkv.size());
  const ops::Mask host_mask{causal, lengths.empty() ? nullptr : lengths.data()};
  host::attention_forward(out64.data(), probs64.data(), qkv64.data(), B, Tn, H, hd, g, host_mask);
  host::attention_backward(dqkv64.data(), dout64.data(), qkv64.data(), probs64.data(), B, Tn, H, hd, g, host_mask);
  Allocation glen = d.allocate(static_cast<std::int64_t>(sizeof(std::int32_t) * 2));
  if (!lengths.empty()) d.from_host(glen.data(), lengths.data(), 2 * sizeof(std::int32_t));
  const ops::Mask mask{causal, lengths.empty() ? nullptr : static_cast<const std::int32_t*>(glen.data())};

  Allocation gq = d.allocate(static_cast<std::int64_t>(qkv.size() * sizeof(T))),
             gd = d.allocate(static_cast<std::int64_t>(dout.size() * sizeof(T))),
             go = d.allocate(static_cast<std::int64_t>(dout.size() * sizeof(T))),
             gp = d.allocate(static_cast<std::int64_t>(probs64.size() * sizeof(T))),
             gdq = d.allocate(static_cast<std::int64_t>(qkv.size() * sizeof(T)));
  d.from_host(gq.data(), qkv.data(), qkv.size() * sizeof(T));
  d.from_host(gd.data(), dout.data(), dout.size() * sizeof(T));
  auto* q = static_cast<T*>(gq.data());
  ops::Attention<Cuda>::forward(d, static_cast<T*>(go.data()), static_cast<T*>(gp.data()), q, B, Tn, H, hd, g, mask);
  ops::Attention<Cuda>::backward(d, static_cast<T*>(gdq.data()), static_cast<const T*>(gd.data()), q,
                                 static_cast<const T*>(gp.data()), B, Tn, H, hd, g, mask);
  std::vector<T> out(dout.size()), dq(qkv.size());
  d.to_host(out.data(), go.data(), out.size() * sizeof(T));
  d.to_host(dq.data(), gdq.data(), dq.size() * sizeof(T));
  std::vector<double> o(out.size()), grad(dq.size());
  for (std::size_t i = 0; i < o.size(); ++i) o[i] = test::to_double(out[i]);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = test::to_double(dq[i]);
  return {test::rel_error(o, out64), test::rel_error(grad, dqkv64)};
}

}  // namespace

TEST_CASE("GPU attention equals the host's for T = 1, 17, 64, 257, 1024 and head sizes 64, 128") {
  // f32: sums of up to T hd products in another order: 1e-5 of the largest value. bf16: inputs are
  // the same rounded values; the GPU rounds the probabilities and the output to bf16 (2^-8
  // relative each), so 2e-2.
  for (std::int64_t hd : {64, 128})
    for (std::int64_t Tn : {1, 17, 64, 257, 1024}) {
      const auto [of, gf] = attention_error<float>(Tn, hd);
      CHECK_MESSAGE(of <= 1e-5, "f32 forward, T ", Tn, ", hd ", hd, ": ", of);
      CHECK_MESSAGE(gf <= 1e-5, "f32 backward, T ", Tn, ", hd ", hd, ": ", gf);
      const auto [ob, gb] = attention_error<bf16>(Tn, hd);
      CHECK_MESSAGE(ob <= 2e-2, "bf16 forward, T ", Tn, ", hd ", hd, ": ", ob);
      CHECK_MESSAGE(gb <= 2e-2, "bf16 backward, T ", Tn, ", hd ", hd, ": ", gb);
    }
}

TEST_CASE("GPU grouped-query attention equals the host's: 4 heads in 2 groups of 2 and in 1 group of 4") {
  // As above; a group's key and value gradients sum over its heads (in head order, in float), so
  // f32 adds at most g sums of the same size: the 1e-5 holds (the host's own layouts meet it).
  for (std::int64_t g : {2, 4})
    for (std::int64_t Tn : {17, 257}) {
      const auto [of, gf] = attention_error<float>(Tn, 64, 4, g);
      CHECK_MESSAGE(of <= 1e-5, "f32 forward, g ", g, ", T ", Tn, ": ", of);
      CHECK_MESSAGE(gf <= 1e-5, "f32 backward, g ", g, ", T ", Tn, ": ", gf);
      const auto [ob, gb] = attention_error<bf16>(Tn, 64, 4, g);
      CHECK_MESSAGE(ob <= 2e-2, "bf16 forward, g ", g, ", T ", Tn, ": ", ob);
      CHECK_MESSAGE(gb <= 2e-2, "bf16 backward, g ", g, ", T ", Tn, ": ", gb);
    }
}

TEST_CASE(
    "GPU attention without a mask and with padding equals the host's: T = 17, 257, 4 heads in groups of 1 and 2") {
  // Tolerances as above. Lengths: the first sample whole, the second padded from inside a 32-row
  // tile (T = 17: from 9; T = 257: from 100), so both the tile skipping and the row ends are tried.
  for (std::int64_t g : {1, 2})
    for (std::int64_t Tn : {17, 257})
      for (const bool causal : {false, true})
        for (const bool padded : {false, true}) {
          if (causal && !padded) continue;  // the cases above
          const std::vector<std::int32_t> lengths =
              padded ? std::vector<std::int32_t>{static_cast<std::int32_t>(Tn), Tn == 17 ? 9 : 100}
                     : std::vector<std::int32_t>{};
          const auto [of, gf] = attention_error<float>(Tn, 64, 4, g, causal, lengths);
          const auto [ob, gb] = attention_error<bf16>(Tn, 64, 4, g, causal, lengths);
          INFO("g ", g, ", T ", Tn, (causal ? ", causal" : ", bidirectional"), (padded ? ", padded" : ""));
          CHECK_MESSAGE(of <= 1e-5, "f32 forward: ", of);
          CHECK_MESSAGE(gf <= 1e-5, "f32 backward: ", gf);
          CHECK_MESSAGE(ob <= 2e-2, "bf16 forward: ", ob);
          CHECK_MESSAGE(gb <= 2e-2, "bf16 backward: ", gb);
        }
}

TEST_CASE(
    "the tiny GPT on the GPU in f32: loss and every gradient within 1e-5 of the host, tensor 1, 2, 4, with and without SP") {
  (void)test::gpu();
  // The host f32 run at one rank is the reference; the GPU sums in other orders (float, ~1e-7
  // relative per sum), amplified through softmax and LayerNorm: 1e-5, the tolerance the host's own
  // tensor-parallel runs meet.
  gpt2::Config c = test::tiny_config();  // width 32, heads 4: head size 8
  const auto ref = test::run_gpt<float, false, recompute::None, Host>(1, c);
  for (int tp : {1, 2, 4}) {
    std::string where;
    const double e = test::worst_error(test::run_gpt<float, false, recompute::None, Cuda>(tp, c), ref, &where);
    CHECK_MESSAGE(e <= 1e-5, "tp ", tp, " without SP: ", where, " off by ", e);
    const double es = test::worst_error(test::run_gpt<float, true, recompute::Selective, Cuda>(tp, c), ref, &where);
    CHECK_MESSAGE(es <= 1e-5, "tp ", tp, " with SP: ", where, " off by ", es);
  }
}

TEST_CASE(
    "the tiny Llama on the GPU in f32: loss and every gradient within 1e-5 of the host, tensor 1 and 2, with and without SP") {
  (void)test::gpu();
  // RMSNorm, rotary (llama3 scaling, all three frequency bands), grouped-query attention (4 heads
  // over 2 key-value heads: tensor 2 holds a group each) and SwiGLU through Ops<Cuda>; the host's
  // f32 run at one rank is the reference, 1e-5 as for the GPT above.
  const llama::Config c{
      .vocab = 65,
      .seq = 16,
      .layers = 2,
      .heads = 4,
      .kv_heads = 2,
      .width = 32,
      .hidden = 48,
      .rope = {.theta = 500, .factor = 4, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 64},
      .norm_eps = 1e-5,
      .seed = 3,
      .init_std = 0.2};
  const auto ref = test::run_model<llama::Model<float, false, recompute::None, Host>>(1, c);
  REQUIRE(ref.grads.count("lm_head") == 1);
  for (int tp : {1, 2}) {
    std::string where;
    const double e =
        test::worst_error(test::run_model<llama::Model<float, false, recompute::None, Cuda>>(tp, c), ref, &where);
    CHECK_MESSAGE(e <= 1e-5, "tp ", tp, " without SP: ", where, " off by ", e);
    const double es =
        test::worst_error(test::run_model<llama::Model<float, true, recompute::Selective, Cuda>>(tp, c), ref, &where);
    CHECK_MESSAGE(es <= 1e-5, "tp ", tp, " with SP: ", where, " off by ", es);
  }
}

TEST_CASE("FP8 on the GPU: the tiny GPT's loss and every gradient within 1e-5 of the host's, rowwise and blockwise") {
  (void)test::gpu();
  // An f32 model with FP8 GEMMs (ops/scaled_gemm.cuh): the casts are the host's byte for byte, the
  // GEMMs sum in another order, as above (1e-5). Rowwise on one tensor rank (a tensor-parallel
  // layer's amaxes are reduced on the host only so far: refused on the GPU), blockwise 1x16 also on
  // tensor 2 (its blocks lie within a shard: nothing to reduce).
  const gpt2::Config c = test::tiny_config();
  using Rowwise = Precision<float, float, fp8::Gemms<fp8::scaling::Rowwise>>;
  using Blockwise = Precision<float, float, fp8::Gemms<fp8::scaling::Blockwise<16>>>;
  std::string where;
  const double rowwise = test::worst_error(test::run_gpt<Rowwise, false, recompute::None, Cuda>(1, c),
                                           test::run_gpt<Rowwise, false, recompute::None, Host>(1, c), &where);
  CHECK_MESSAGE(rowwise <= 1e-5, "rowwise: ", where, " off by ", rowwise);
  const auto ref = test::run_gpt<Blockwise, false, recompute::None, Host>(1, c);
  for (int tp : {1, 2}) {
    const double e = test::worst_error(test::run_gpt<Blockwise, false, recompute::None, Cuda>(tp, c), ref, &where);
    CHECK_MESSAGE(e <= 1e-5, "blockwise, tensor ", tp, ": ", where, " off by ", e);
  }
}

TEST_CASE("the tiny DiT on the GPU in f32: loss and every gradient within 1e-5 of the host, tensor 1 and 2 with SP") {
  (void)test::gpu();
  // Patches, the conditioning MLP and label table (SiLU, the embedding op), adaLN modulation and
  // gates, bidirectional biased attention, the MSE head through Ops<Cuda>, against the host's f32
  // run at one rank (1e-5 as for the language models above).
  dit::Config c;
  c.zero_init = false;
  c.init_std = 0.2;
  dit::SyntheticLatents<float> batches(c, dit::Ddpm{}, 4, 1, 0, 1);
  const auto mb = batches.next(0, 0, 1.0);
  const auto ref = test::run_model_on<dit::Model<float, false, recompute::None, Host>>(1, c, mb);
  for (int tp : {1, 2}) {
    std::string where;
    const double e =
        test::worst_error(test::run_model_on<dit::Model<float, true, recompute::None, Cuda>>(tp, c, mb), ref, &where);
    CHECK_MESSAGE(e <= 1e-5, "tp ", tp, " with SP: ", where, " off by ", e);
  }
}

TEST_CASE("a padded batch on the GPU in f32: loss and every gradient within 1e-5 of the host, tensor 1 and 2 with SP") {
  (void)test::gpu();
  // nn/padding.hpp: the attention layer reads the lengths' device copy (StagedModel::in_flight), the
  // MSE head its host copy; lengths 8, 3, 5, 1 of 8 (tests/nn/feature_spec.hpp's model).
  using In = test::feature::PaddedFeaturesOf<float>;
  const test::feature::Config c;
  const std::int64_t B = 4;
  std::vector<float> x(static_cast<std::size_t>(B * c.seq * c.in)), y(static_cast<std::size_t>(B * c.seq * c.out));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(weft::normal(5, 1, i));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(weft::normal(5, 2, i));
  const std::vector<std::int32_t> lengths{8, 3, 5, 1};
  const nn::Batch<In> mb{{x, y, lengths}, B, 1.0};
  using namespace test::feature;
  const auto ref = test::run_model_on<nn::StagedModel<Spec<false, context::None, In, float, Host>>>(1, c, mb);
  for (int tp : {1, 2}) {
    std::string where;
    const double e = test::worst_error(
        test::run_model_on<nn::StagedModel<Spec<true, context::None, In, float, Cuda>>>(tp, c, mb), ref, &where);
    CHECK_MESSAGE(e <= 1e-5, "tp ", tp, " with SP: ", where, " off by ", e);
  }
}

TEST_CASE(
    "a mixture-of-experts layer on the GPU in f32 equals the host's within 1e-5, and repeats bit for bit: softmax, "
    "and sigmoid scores with an expert bias, alone and group-limited") {
  // nn::MoeMlp through Route, Dispatch, SwiGlu and the experts' GEMMs on Cuda: 8 experts, top 2
  // renormalised, a capacity that drops tokens, a shared expert, both router losses; then sigmoid
  // scores (DeepSeek-V3's) with an expert bias and a scale, the load in the bias's buffer, and those
  // with group-limited routing. The same weights and inputs on both devices (copied), one forward
  // and backward each.
  Cuda& d = test::gpu();
  Host hd;
  const std::int64_t B = 2, T = 16, C = 32;
  const nn::MoeOptions softmax{.experts = 8,
                               .top_k = 2,
                               .hidden = 16,
                               .capacity_factor = 1.0,
                               .aux_coef = 0.1,
                               .z_coef = 0.01,
                               .shared_hidden = 8};
  nn::MoeOptions sigmoid = softmax;
  sigmoid.z_coef = 0;
  sigmoid.score = nn::Score::sigmoid;
  sigmoid.scale = 2.5;
  sigmoid.expert_bias = true;
  nn::MoeOptions grouped = sigmoid;  // DeepSeek-V3's group-limited routing: the top 2 from 2 of 4 groups
  grouped.groups = 4;
  grouped.top_groups = 2;
  for (const nn::MoeOptions& o : {softmax, sigmoid, grouped}) {
    INFO((o.groups > 1                    ? "sigmoid scores, an expert bias, 2 of 4 groups"
          : o.score == nn::Score::sigmoid ? "sigmoid scores, an expert bias"
                                          : "softmax"));
    std::vector<float> x(static_cast<std::size_t>(B * T * C)), dy(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(weft::normal(7, 1, i));
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(weft::normal(7, 2, i));
    struct Out {
      std::vector<float> y, dx;
      std::vector<std::vector<float>> grads;
      double aux = 0, z = 0;
      std::int64_t dropped = 0;
    };
    auto run = [&]<class D>(D& dev) {
      Out out;
      run_threads(1, [&](ThreadComm& world) {
        Mesh mesh{world, {}};
        nn::MoeMlp<float, nn::act::Full, Host> ref(hd, C, o, mesh.spread(), 0, 5, 0.3, 0.3);
        nn::MoeMlp<float, nn::act::Full, D> m(dev, C, o, mesh.spread(), 0, 5, 0.3, 0.3);
        for (std::int64_t e = 0; o.expert_bias && e < o.experts; ++e)
          ref.bias.value.data()[e] = 0.1f * static_cast<float>(e % 3) - 0.1f;
        std::vector<std::span<const float>> host_values;
        ref.for_each_param("", [&](const std::string&, auto& p) {
          host_values.emplace_back(p.value.data(), static_cast<std::size_t>(p.value.numel()));
        });
        std::size_t i = 0;
        m.for_each_param("", [&](const std::string&, auto& p) {
          dev.from_host(p.value.data(), host_values[i++].data(), host_values[i - 1].size_bytes());
        });
        auto xt = Tensor<float, nn::act::Full, D>::empty(dev, {B, T, C}, mesh.spread(), Category::activations);
        auto gt = Tensor<float, nn::act::Full, D>::empty(dev, {B, T, C}, mesh.spread(), Category::activations);
        dev.from_host(xt.data(), x.data(), x.size() * sizeof(float));
        dev.from_host(gt.data(), dy.data(), dy.size() * sizeof(float));
        typename nn::MoeMlp<float, nn::act::Full, D>::Ctx ctx;
        const auto y = m.forward(ctx, xt, mesh);
        const auto dx = m.backward(ctx, gt, mesh);
        out.y.resize(x.size());
        out.dx.resize(x.size());
        dev.to_host(out.y.data(), y.data(), x.size() * sizeof(float));
        dev.to_host(out.dx.data(), dx.data(), x.size() * sizeof(float));
        m.for_each_param("", [&](const std::string&, auto& p) {
          out.grads.emplace_back(static_cast<std::size_t>(p.grad.numel()));
          dev.to_host(out.grads.back().data(), p.grad.data(), out.grads.back().size() * sizeof(float));
        });
        out.aux = m.last_aux, out.z = m.last_z, out.dropped = m.last_dropped;
      });
      return out;
    };
    const Out host = run(hd), gpu = run(d), again = run(d);
    auto err = [](const std::vector<float>& a, const std::vector<float>& b) {
      std::vector<double> da(a.begin(), a.end()), db(b.begin(), b.end());
      return test::rel_error(da, db);
    };
    CHECK(gpu.dropped == host.dropped);
    CHECK(host.dropped > 0);
    CHECK(std::abs(gpu.aux - host.aux) <= 1e-5 * host.aux);
    CHECK(std::abs(gpu.z - host.z) <= 1e-5 * host.z);
    CHECK(err(gpu.y, host.y) <= 1e-5);  // f32 both, other summation orders
    CHECK(err(gpu.dx, host.dx) <= 1e-5);
    REQUIRE(gpu.grads.size() == host.grads.size());
    for (std::size_t p = 0; p < host.grads.size(); ++p)
      CHECK_MESSAGE(err(gpu.grads[p], host.grads[p]) <= 1e-5, "parameter ", p);
    // No atomics: a second run gives the same bits.
    CHECK(again.y == gpu.y);
    CHECK(again.dx == gpu.dx);
    CHECK(again.grads == gpu.grads);
  }
}

TEST_CASE_TEMPLATE(
    "a mixture-of-experts layer over expert 2 on thread ranks sharing the GPU equals the host's one rank within 1e-5",
    Dsp, nn::AllToAllDispatch, nn::AllGatherDispatch) {
  // data 2 x expert 2: each rank holds half the batch and 4 of the 8 experts; the all-to-all's
  // counts and rows (or the all-gathers and reduce-scatters) move device buffers between the
  // ranks' streams. Against the host layer on one rank with the same weights (copied).
  (void)test::gpu();
  Host hd;
  const std::int64_t B = 4, T = 8, C = 32;
  const nn::MoeOptions o{.experts = 8, .top_k = 2, .hidden = 16, .aux_coef = 0.1, .z_coef = 0.01};
  std::vector<float> x(static_cast<std::size_t>(B * T * C)), dy(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(weft::normal(9, 1, i));
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(weft::normal(9, 2, i));
  using Full = nn::act::Full;
  nn::MoeMlp<float, Full, Host> ref(hd, C, o, Spread{}, 0, 5, 0.3, 0.3);
  std::vector<float> ry, rdx;
  std::vector<std::vector<float>> rgrads;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    auto xt = Tensor<float, Full, Host>::empty(hd, {B, T, C}, mesh.spread(), Category::activations);
    auto gt = Tensor<float, Full, Host>::empty(hd, {B, T, C}, mesh.spread(), Category::activations);
    std::copy(x.begin(), x.end(), xt.data());
    std::copy(dy.begin(), dy.end(), gt.data());
    nn::MoeMlp<float, Full, Host>::Ctx ctx;
    const auto y = ref.forward(ctx, xt, mesh);
    const auto dx = ref.backward(ctx, gt, mesh);
    ry.assign(y.data(), y.data() + y.numel());
    rdx.assign(dx.data(), dx.data() + dx.numel());
    ref.for_each_param(
        "", [&](const std::string&, auto& p) { rgrads.emplace_back(p.grad.data(), p.grad.data() + p.grad.numel()); });
  });
  std::vector<float> y(x.size()), dx(x.size());
  std::vector<std::vector<float>> grads(2 * 3);  // per rank: router, gate_up, down
  run_threads(2, [&](ThreadComm& world) {
    auto dev = test::rank_device<Cuda>(world);
    Mesh mesh{world, {.data = 2, .expert = 2}};
    const int r = mesh.coord().data, e = mesh.coord().expert;
    nn::MoeMlp<float, Full, Cuda, Dsp> m(*dev, C, o, mesh.spread(), 0, 5, 0.3, 0.3);
    int i = 0;
    ref.for_each_param("", [&](const std::string&, auto& p) {
      const std::int64_t n = i == 0 ? p.value.numel() : p.value.numel() / 2, at = i == 0 ? 0 : e * n;
      m.for_each_param("", [&, j = 0](const std::string&, auto& q) mutable {
        if (j++ == i) dev->from_host(q.value.data(), p.value.data() + at, static_cast<std::size_t>(n) * sizeof(float));
      });
      ++i;
    });
    const std::int64_t half = B / 2 * T * C;
    auto xt = Tensor<float, Full, Cuda>::empty(*dev, {B, T, C}, mesh.spread(), Category::activations);
    auto gt = Tensor<float, Full, Cuda>::empty(*dev, {B, T, C}, mesh.spread(), Category::activations);
    dev->from_host(xt.data(), x.data() + r * half, static_cast<std::size_t>(half) * sizeof(float));
    dev->from_host(gt.data(), dy.data() + r * half, static_cast<std::size_t>(half) * sizeof(float));
    typename nn::MoeMlp<float, Full, Cuda, Dsp>::Ctx ctx;
    const auto yt = m.forward(ctx, xt, mesh);
    const auto dxt = m.backward(ctx, gt, mesh);
    dev->to_host(y.data() + r * half, yt.data(), static_cast<std::size_t>(half) * sizeof(float));
    dev->to_host(dx.data() + r * half, dxt.data(), static_cast<std::size_t>(half) * sizeof(float));
    int j = 0;
    m.for_each_param("", [&](const std::string&, auto& q) {
      auto& g = grads[static_cast<std::size_t>(3 * r + j++)];
      g.resize(static_cast<std::size_t>(q.grad.numel()));
      dev->to_host(g.data(), q.grad.data(), g.size() * sizeof(float));
    });
  });
  auto err = [](const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<double> da(a.begin(), a.end()), db(b.begin(), b.end());
    return test::rel_error(da, db);
  };
  CHECK(err(y, ry) <= 1e-5);  // f32 both, other summation orders
  CHECK(err(dx, rdx) <= 1e-5);
  std::vector<float> router(grads[0].size());  // the router's gradient: the two halves' sum
  for (std::size_t i = 0; i < router.size(); ++i) router[i] = grads[0][i] + grads[3][i];
  CHECK(err(router, rgrads[0]) <= 1e-5);
  for (int p = 1; p <= 2; ++p) {  // each expert's, whole on the rank that holds it (expert index = data index)
    std::vector<float> whole = grads[static_cast<std::size_t>(p)];
    whole.insert(whole.end(), grads[static_cast<std::size_t>(3 + p)].begin(),
                 grads[static_cast<std::size_t>(3 + p)].end());
    CHECK_MESSAGE(err(whole, rgrads[static_cast<std::size_t>(p)]) <= 1e-5, "parameter ", p);
  }
}

TEST_CASE("every data strategy trains on the GPU like the host: 5 steps on data 2 x tensor 2 within 1e-5") {
  (void)test::gpu();
  auto check = [&]<class Strategy, bool SP>() {
    const auto host = test::train_markov<F32, Strategy, SP, Host>(5, 2, 2);
    const auto gpu = test::train_markov<F32, Strategy, SP, Cuda>(5, 2, 2);
    REQUIRE(gpu.size() == host.size());
    for (std::size_t i = 0; i < host.size(); ++i)
      CHECK_MESSAGE(std::abs(gpu[i] - host[i]) <= 1e-5 * std::abs(host[i]), Strategy::name(), " SP ", SP, " step ", i);
  };
  check.template operator()<optim::Ddp, false>();
  check.template operator()<optim::Zero1, true>();
  check.template operator()<optim::Zero2, false>();
  check.template operator()<optim::Fsdp, true>();
}

TEST_CASE("bf16 mixed precision on the GPU: 300 steps on the Markov corpus end within 0.05 nats of the host's f32") {
  (void)test::gpu();
  const auto host = test::train_markov<F32, optim::Ddp, false, Host>(300, 1);
  const auto gpu = test::train_markov<Bf16Mixed, optim::Ddp, false, Cuda>(300, 1);
  const double a = test::mean_of_last(host, 50), b = test::mean_of_last(gpu, 50);
  MESSAGE("mean loss of the last 50 steps: host f32 ", a, ", GPU bf16 ", b);
  CHECK(std::abs(a - b) < 0.05);
}

TEST_CASE(
    "thread ranks sharing the GPU keep the thread back end's failure rules: a mismatched collective on device buffers is an Error on every rank") {
  (void)test::gpu();
  // Each rank's call raises the mismatch, and run_threads then raises it too, naming the rank that
  // detected it (the host's rule: tests/comm/mismatch.cpp).
  std::atomic<int> errors{0};
  CHECK_THROWS_WITH_AS(
      run_threads(2,
                  [&](ThreadComm& world) {
                    auto dev = test::rank_device<Cuda>(world);
                    const std::int64_t n = world.rank() == 0 ? 4 : 5;  // rank 1 asks for one element more
                    Allocation b = dev->allocate(n * static_cast<std::int64_t>(sizeof(float)));
                    dev->zero(b.data(), static_cast<std::size_t>(n) * sizeof(float));
                    try {
                      world.all_reduce(std::span<float>(static_cast<float*>(b.data()), static_cast<std::size_t>(n)));
                    } catch (const Error& e) {
                      if (std::string(e.what()).find("mismatched collective") != std::string::npos) ++errors;
                    }
                  }),
      doctest::Contains(
          "mismatched collective #1 on world{0,1}: world rank 0 called all_reduce(f32, 4, sum), world rank 1 called all_reduce(f32, 5, sum)"),
      Error);
  CHECK(errors == 2);
}

TEST_CASE(
    "thread ranks sharing the GPU: all_reduce, reduce_scatter and all_gather of device buffers equal the host's, bitwise") {
  (void)test::gpu();
  // 3 ranks, 1000 elements of f32 and bf16: sums in rank order on the device equal the host's.
  auto check = [&]<class T>() {
    std::vector<std::vector<T>> host_out(3), dev_out(3);
    auto input = [](int r, std::size_t i) {
      return test::from_double<T>(weft::normal(11, static_cast<std::uint64_t>(r), i));
    };
    run_threads(3, [&](ThreadComm& world) {
      std::vector<T> h(1000);
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = input(world.rank(), i);
      world.all_reduce(std::span<T>(h));
      host_out[static_cast<std::size_t>(world.rank())] = h;
    });
    run_threads(3, [&](ThreadComm& world) {
      auto dev = test::rank_device<Cuda>(world);
      std::vector<T> h(1000);
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = input(world.rank(), i);
      Allocation b = dev->allocate(1000 * static_cast<std::int64_t>(sizeof(T)));
      dev->from_host(b.data(), h.data(), 1000 * sizeof(T));
      world.all_reduce(std::span<T>(static_cast<T*>(b.data()), 1000));
      dev->to_host(h.data(), b.data(), 1000 * sizeof(T));
      dev_out[static_cast<std::size_t>(world.rank())] = h;
    });
    for (int r = 0; r < 3; ++r) CHECK(std::memcmp(host_out[r].data(), dev_out[r].data(), 1000 * sizeof(T)) == 0);
  };
  check.template operator()<float>();
  check.template operator()<bf16>();
}
