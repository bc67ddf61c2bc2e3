// A model that is not tokens in / cross-entropy out, written on weft's public headers as a user
// would (tests/nn/feature_spec.hpp): a vector of features at each position in, bidirectional
// attention blocks, a vector of values at each position out with the mean squared error
// (nn::MseHeadStage), its batch a record of two float fields (nn::Batch<Features>).
//
// Checked: the loss against its closed form (the head's projection zeroed: the mean of y^2), every
// gradient against finite differences on one rank, and every layout against one rank in f64
// (1e-12): tensor 2 with and without sequence parallelism, DDP, ZeRO-1 and FSDP over data 2, a
// 1F1B pipeline over 2 ranks, context 2 (ring and all-gather), and mixes of them; fields of the
// wrong size refused by name. Padded (PaddedFeatures, nn/padding.hpp): whole lengths equal the
// unpadded model exactly; the loss is the mean over the valid rows; what lies past a sample's
// length changes nothing; finite differences; every layout against one rank; bad lengths refused.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "nn/feature_spec.hpp"
#include "support/gradcheck.hpp"
#include "support/train_steps.hpp"
#include "weft/nn/describe.hpp"
#include "weft/pipeline/executor.hpp"

using namespace weft;

namespace {

using test::feature::Config;
using Features = test::feature::FeaturesOf<double>;
using PaddedFeatures = test::feature::PaddedFeaturesOf<double>;
static_assert(nn::PaddedInputs<PaddedFeatures> && !nn::PaddedInputs<Features>);

template <bool SP, class Cx = context::None, class In = Features, bool Moe = false>
using Spec = test::feature::Spec<SP, Cx, In, double, Host, Moe>;

template <bool SP, class Cx = context::None, class In = Features, bool Moe = false>
using Regressor = nn::StagedModel<Spec<SP, Cx, In, Moe>>;

const Config kConfig{};
constexpr std::int64_t kMicro = 4;
constexpr int kM = 2;

// Sample g of step s, micro-batch i: x and y drawn from normals keyed by all three, so that every
// data rank reads its own samples of the same global batches whatever the mesh. Padded (In =
// PaddedFeatures): sample g's length is kLengths[(g + 2 s + i) % 8], so that the data ranks hold
// different numbers of valid rows, a context rank may hold none of a sample's, and a sample may be
// whole.
constexpr std::array<std::int32_t, 8> kLengths{8, 3, 5, 1, 6, 2, 7, 4};

template <class In>
struct FeatureBatchesOf {
  Config c;
  std::int64_t micro;
  int data, data_rank;
  std::vector<std::vector<double>> x, y;
  std::vector<std::vector<std::int32_t>> lengths;
  template <class C>
  FeatureBatchesOf(const C& config, std::int64_t micro_batch, int d, int r, int m)
      : c(config), micro(micro_batch), data(d), data_rank(r), x(static_cast<std::size_t>(m)), y(x), lengths(x.size()) {}
  nn::Batch<In> next(int step, int i, double scale) {
    const std::int64_t local = micro / data, first = data_rank * local;
    auto& xs = x[static_cast<std::size_t>(i)];
    auto& ys = y[static_cast<std::size_t>(i)];
    auto& ls = lengths[static_cast<std::size_t>(i)];
    xs.clear();
    ys.clear();
    ls.clear();
    for (std::int64_t b = first; b < first + local; ++b) {
      const auto key = static_cast<std::uint64_t>((step * kM + i) * 1000 + b);
      const auto xb = test::normals(static_cast<std::size_t>(c.seq * c.in), 100 + key);
      const auto yb = test::normals(static_cast<std::size_t>(c.seq * c.out), 5000 + key);
      xs.insert(xs.end(), xb.begin(), xb.end());
      ys.insert(ys.end(), yb.begin(), yb.end());
      ls.push_back(kLengths[static_cast<std::size_t>(b + 2 * step + i) % kLengths.size()]);
    }
    if constexpr (nn::PaddedInputs<In>) return {{xs, ys, ls}, micro, scale};
    else return {{xs, ys}, micro, scale};
  }
};
using FeatureBatches = FeatureBatchesOf<Features>;

template <bool SP, class Cx = context::None, class Strategy = optim::Ddp, class In = Features, bool Moe = false>
test::StepsRun run(int data, int pipe, int context, int tensor, const Config& c = kConfig, int expert = 1) {
  return test::train_steps<Regressor<SP, Cx, In, Moe>, pipeline::OneFOneB, Strategy, FeatureBatchesOf<In>>(
      c, kMicro, kM, pipe, 1, tensor, data, 2, context, expert);
}

void check_equal(const test::StepsRun& got, const test::StepsRun& ref, const std::string& what, bool sharded = false) {
  INFO(what);
  // f64: the same sums in other orders (tensor and data reductions, the context blocks' merge).
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    CHECK(std::abs(got.losses[i] - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]));
  std::string where;
  if (!got.grads.empty() || !sharded)  // the sharded strategies keep slices of the gradients
    CHECK_MESSAGE(test::worst_tensor(got.grads, ref.grads, where) <= 1e-12, "gradient ", where);
  // The values after two AdamW steps as one vector (max difference over max value). (The attention
  // has no biases: a key bias's exact gradient is zero, and Adam would turn its rounding noise into
  // updates of 1e-11 that differ between layouts; tests/pipeline/equivalence.cpp.)
  double diff = 0, scale = 0;
  for (const auto& [name, v] : ref.values)
    for (std::size_t i = 0; i < v.size(); ++i) {
      diff = test::worse(diff, std::abs(got.values.at(name).at(i) - v[i]));
      scale = std::max(scale, std::abs(v[i]));
    }
  CHECK(got.values.size() == ref.values.size());
  CHECK(diff / scale <= 1e-12);
  MESSAGE(what, ": values after two steps within ", diff / scale);
}

// The router losses an MoE model's blocks added in their last forward, with their coefficients (0
// for a model without experts): what its gradients include besides the head's loss.
template <class Model>
double model_router_losses(Model& model) {
  double sum = 0;
  for (auto& block : model.blocks) {
    auto& layer = std::get<1>(std::get<1>(block.layers).inner.layers);  // Residual<ln2, moe>'s moe
    if constexpr (requires { layer.last_aux; })
      sum += layer.options.aux_coef * layer.last_aux + layer.options.z_coef * layer.last_z;
  }
  return sum;
}

// Every gradient of Model on one rank (its first micro-batch of In) against finite differences of
// its loss; returns how many parameters were checked.
template <class Model, class In>
std::size_t check_finite_differences() {
  std::size_t params = 0;
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Model model(h, kConfig, mesh.spread(), kMicro);
    FeatureBatchesOf<In> batches(kConfig, kMicro, 1, 0, 1);
    const auto mb = batches.next(0, 0, 1.0);
    auto loss = [&] {
      auto c = model.in_flight(mb);
      pipeline::forward(model, c, mesh, pipeline::LocalGradients{}, nn::Mode::infer);
      return c.loss + model_router_losses(model);
    };
    model.zero_grad();
    auto ctx = model.in_flight(mb);
    pipeline::forward_backward(model, ctx, mesh);
    model.for_each_param([&](const std::string& name, auto& p) {
      INFO(name);
      const auto r =
          test::gradcheck(std::span<double>(p.value.data(), static_cast<std::size_t>(p.value.numel())),
                          std::span<const double>(p.grad.data(), static_cast<std::size_t>(p.grad.numel())), loss, 40);
      CHECK(r.checked > 0);
      CHECK(r.worst <= 1e-6);  // support/gradcheck.hpp: central differences in double
      ++params;
    });
  });
  return params;
}

}  // namespace

TEST_CASE("a feature model's loss is the mean squared error: with the projection zeroed, the mean of y^2") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Regressor<false> model(h, kConfig, mesh.spread(), kMicro);
    ops::Memory<Host>::fill(h, model.head.weight.value.data(), model.head.weight.value.numel(), 0.0);
    FeatureBatches batches(kConfig, kMicro, 1, 0, 1);
    const auto mb = batches.next(0, 0, 1.0);
    auto ctx = model.in_flight(mb);
    pipeline::forward(model, ctx, mesh, pipeline::LocalGradients{}, nn::Mode::infer);
    double sum = 0;
    for (double v : batches.y[0]) sum += v * v;
    // A sum of 96 squares in another order: rounding alone.
    CHECK(ctx.loss == doctest::Approx(sum / static_cast<double>(batches.y[0].size())).epsilon(1e-14));
    CHECK(ctx.loss > 0.5);  // unit normals: about 1
  });
}

TEST_CASE("a feature model's gradients match finite differences on one rank") {
  // in_proj (2), per block ln1 (2), attn (qkv, proj: 2), ln2 (2), mlp (4), and the head's norm (2)
  // and out_proj (2).
  CHECK(check_finite_differences<Regressor<false>, Features>() == 2 + 2 * 10 + 4);
}

TEST_CASE("a feature model on every layout equals one rank in f64 (1e-12): loss, gradients and weights") {
  const test::StepsRun ref = run<false>(1, 1, 1, 1);
  check_equal(run<false>(1, 1, 1, 2), ref, "tensor 2");
  check_equal(run<true>(1, 1, 1, 2), ref, "tensor 2 with sequence parallelism");
  check_equal(run<false>(2, 1, 1, 1), ref, "DDP over data 2");
  check_equal(run<false, context::None, optim::Zero1>(2, 1, 1, 1), ref, "ZeRO-1 over data 2", true);
  check_equal(run<false, context::None, optim::Fsdp>(2, 1, 1, 1), ref, "FSDP over data 2", true);
  check_equal(run<false>(1, 2, 1, 1), ref, "1F1B over pipe 2");
  check_equal(run<false, context::Ring>(1, 1, 2, 1), ref, "context 2 (ring)");
  check_equal(run<false, context::AllGather>(1, 1, 2, 1), ref, "context 2 (all-gather)");
  check_equal(run<true, context::Ring>(2, 2, 2, 2), ref, "data 2 x pipe 2 x context 2 x tensor 2 with SP");
}

TEST_CASE("a feature model refuses fields of the wrong size, naming the field") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Regressor<false> model(h, kConfig, mesh.spread(), kMicro);
    const std::vector<double> x(static_cast<std::size_t>(kMicro * kConfig.seq * kConfig.in)),
        y(static_cast<std::size_t>(kMicro * kConfig.seq * kConfig.out - 1));
    CHECK_THROWS_WITH_AS(model.in_flight({{x, y}, kMicro, 1.0}),
                         "regressor::in_flight: the field 'y' holds 95 values where the local batch needs 96; pass "
                         "(batch / data degree) x seq x out (24) values",
                         Error);
  });
}

// Padding (nn/padding.hpp): the same model over PaddedFeatures.
namespace {

using Padded = Regressor<false, context::None, PaddedFeatures>;

struct LossAndGrads {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
};

// One forward and backward of mb on one rank, from the model's initial weights.
template <class Model, class Batch>
LossAndGrads one_rank(const Batch& mb, bool zero_projection = false) {
  LossAndGrads out;
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Model model(h, kConfig, mesh.spread(), kMicro);
    if (zero_projection)
      ops::Memory<Host>::fill(h, model.head.weight.value.data(), model.head.weight.value.numel(), 0.0);
    model.zero_grad();
    auto ctx = model.in_flight(mb);
    out.loss = pipeline::forward_backward(model, ctx, mesh);
    model.for_each_param([&](const std::string& name, auto& p) {
      out.grads[name].assign(p.grad.data(), p.grad.data() + p.grad.numel());
    });
  });
  return out;
}

}  // namespace

TEST_CASE("padding: samples of the whole sequence's length give the unpadded model's loss and gradients exactly") {
  FeatureBatchesOf<PaddedFeatures> batches(kConfig, kMicro, 1, 0, 1);
  auto mb = batches.next(0, 0, 1.0);
  std::vector<std::int32_t> whole(static_cast<std::size_t>(kMicro), static_cast<std::int32_t>(kConfig.seq));
  mb.lengths = whole;
  const LossAndGrads padded = one_rank<Padded>(mb);
  const LossAndGrads plain = one_rank<Regressor<false>>(nn::Batch<Features>{{mb.x, mb.y}, kMicro, 1.0});
  // The same operations on the same values: the attention sees every key, the count is B T F.
  CHECK(padded.loss == plain.loss);
  REQUIRE(padded.grads.size() == plain.grads.size());
  for (const auto& [name, g] : plain.grads) CHECK_MESSAGE(padded.grads.at(name) == g, name);
}

TEST_CASE("padding: the loss is the mean squared error over the valid rows (projection zeroed: their mean of y^2)") {
  FeatureBatchesOf<PaddedFeatures> batches(kConfig, kMicro, 1, 0, 1);
  const auto mb = batches.next(0, 0, 1.0);
  double sum = 0;
  std::int64_t rows = 0;
  for (std::int64_t b = 0; b < kMicro; ++b)
    for (std::int64_t t = 0; t < mb.lengths[static_cast<std::size_t>(b)]; ++t, ++rows)
      for (std::int64_t f = 0; f < kConfig.out; ++f) {
        const double v = mb.y[static_cast<std::size_t>((b * kConfig.seq + t) * kConfig.out + f)];
        sum += v * v;
      }
  CHECK(rows == 8 + 3 + 5 + 1);  // kLengths' first four
  const double loss = one_rank<Padded>(mb, true).loss;
  // The valid rows' squares in another order: rounding alone.
  CHECK(loss == doctest::Approx(sum / static_cast<double>(rows * kConfig.out)).epsilon(1e-14));
  // Not the mean over every row (what a head that ignored the lengths would give).
  double all = 0;
  for (double v : mb.y) all += v * v;
  CHECK(std::abs(loss - all / static_cast<double>(mb.y.size())) > 1e-3);
}

TEST_CASE("padding: what lies past a sample's length changes neither the loss nor any gradient") {
  FeatureBatchesOf<PaddedFeatures> batches(kConfig, kMicro, 1, 0, 1);
  const auto mb = batches.next(0, 0, 1.0);
  const LossAndGrads ref = one_rank<Padded>(mb);
  std::vector<double> x(mb.x.begin(), mb.x.end()), y(mb.y.begin(), mb.y.end());
  std::int64_t changed = 0;
  for (std::int64_t b = 0; b < kMicro; ++b)
    for (std::int64_t t = mb.lengths[static_cast<std::size_t>(b)]; t < kConfig.seq; ++t, ++changed) {
      for (std::int64_t f = 0; f < kConfig.in; ++f)
        x[static_cast<std::size_t>((b * kConfig.seq + t) * kConfig.in + f)] += 3.0;
      for (std::int64_t f = 0; f < kConfig.out; ++f)
        y[static_cast<std::size_t>((b * kConfig.seq + t) * kConfig.out + f)] = -5.0;
    }
  CHECK(changed == 4 * 8 - 17);
  auto moved = mb;
  moved.x = x;
  moved.y = y;
  const LossAndGrads got = one_rank<Padded>(moved);
  // Exactly: a padded key has no weight in any valid query's softmax, and a padded row's error and
  // gradient are zeros, which add nothing to any sum.
  CHECK(got.loss == ref.loss);
  for (const auto& [name, g] : ref.grads) CHECK_MESSAGE(got.grads.at(name) == g, name);
  // And the padding matters where it is valid data: the same change one row earlier moves the loss.
  auto earlier = mb;
  x.assign(mb.x.begin(), mb.x.end());
  x[static_cast<std::size_t>((0 * kConfig.seq + 7) * kConfig.in)] += 3.0;  // sample 0 is whole (length 8)
  earlier.x = x;
  CHECK(one_rank<Padded>(earlier).loss != ref.loss);
}

TEST_CASE("padding: every gradient matches finite differences of the masked loss on one rank") {
  CHECK(check_finite_differences<Padded, PaddedFeatures>() == 2 + 2 * 10 + 4);
}

TEST_CASE("padding on every layout equals one rank in f64 (1e-12): loss, gradients and weights") {
  // Data 2 holds 11 and 6 valid rows in the first micro-batch: a mean per rank would differ.
  const test::StepsRun ref = run<false, context::None, optim::Ddp, PaddedFeatures>(1, 1, 1, 1);
  check_equal(run<false, context::None, optim::Ddp, PaddedFeatures>(1, 1, 1, 2), ref, "padded: tensor 2");
  check_equal(run<true, context::None, optim::Ddp, PaddedFeatures>(1, 1, 1, 2), ref, "padded: tensor 2, SP");
  check_equal(run<false, context::None, optim::Ddp, PaddedFeatures>(2, 1, 1, 1), ref, "padded: DDP over data 2");
  check_equal(run<false, context::None, optim::Fsdp, PaddedFeatures>(2, 1, 1, 1), ref, "padded: FSDP over data 2",
              true);
  check_equal(run<false, context::None, optim::Ddp, PaddedFeatures>(1, 2, 1, 1), ref, "padded: 1F1B over pipe 2");
  check_equal(run<false, context::Ring, optim::Ddp, PaddedFeatures>(1, 1, 2, 1), ref, "padded: context 2 (ring)");
  check_equal(run<false, context::AllGather, optim::Ddp, PaddedFeatures>(1, 1, 2, 1), ref,
              "padded: context 2 (all-gather)");
  check_equal(run<true, context::Ring, optim::Ddp, PaddedFeatures>(2, 2, 2, 2), ref,
              "padded: data 2 x pipe 2 x context 2 x tensor 2 with SP");
  // And the padding is felt: the padded run is not the unpadded one.
  const test::StepsRun plain = run<false>(1, 1, 1, 1);
  CHECK(std::abs(plain.losses[0] - ref.losses[0]) > 1e-3);
}

TEST_CASE("padding: lengths out of [1, seq], or not one a sample, refused by name") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Padded model(h, kConfig, mesh.spread(), kMicro);
    FeatureBatchesOf<PaddedFeatures> batches(kConfig, kMicro, 1, 0, 1);
    auto mb = batches.next(0, 0, 1.0);
    std::vector<std::int32_t> lengths{8, 0, 5, 1};
    mb.lengths = lengths;
    CHECK_THROWS_WITH_AS(model.in_flight(mb),
                         "regressor::in_flight: sample 1 has 0 valid positions of 8; give each sample a length from 1 "
                         "to the sequence length (padding at the end)",
                         Error);
    lengths = {8, 3, 9, 1};
    CHECK_THROWS_WITH_AS(model.in_flight(mb),
                         "regressor::in_flight: sample 2 has 9 valid positions of 8; give each sample a length from 1 "
                         "to the sequence length (padding at the end)",
                         Error);
    mb.lengths = std::span<const std::int32_t>(lengths).first(3);
    CHECK_THROWS_WITH_AS(model.in_flight(mb),
                         "regressor::in_flight: the field 'lengths' holds 3 values where the local batch needs 4; pass "
                         "(batch / data degree) x 1 values",
                         Error);
  });
}

TEST_CASE("describe's rows count the data axis's all-reduces as the run makes them: padded, and with experts") {
  // A forward's collectives on the data axis (the head's one all-reduce: the loss's sum, and the
  // valid rows' count where padded) against the rows describe walks.
  auto check = [&]<class In, bool Moe = false>(std::uint64_t bytes) {
    INFO(std::string(nn::PaddedInputs<In> ? "padded" : "unpadded"), Moe ? " with experts" : "");
    std::mutex mu;
    run_threads(2, [&](ThreadComm& world) {
      Host h;
      Mesh mesh{world, {.data = 2}};
      Regressor<false, context::None, In, Moe> model(h, kConfig, mesh.spread(), kMicro);
      std::uint64_t planned = 0;
      for (const nn::CommRow& row : nn::walked_comm_rows(model, kMicro, mesh.spread()))
        for (const CommStep& st : row.forward)
          if (st.axis == Axis::data) planned += static_cast<std::uint64_t>(st.bytes_in);
      FeatureBatchesOf<In> batches(kConfig, kMicro, 2, mesh.coord().data, 1);
      auto ctx = model.in_flight(batches.next(0, 0, 1.0));
      const threads::Counters before = mesh.comm(Axis::data).counters();
      pipeline::forward(model, ctx, mesh, pipeline::LocalGradients{}, nn::Mode::infer);
      const threads::Counters ran = mesh.comm(Axis::data).counters() - before;
      const auto ar = static_cast<std::size_t>(threads::Op::all_reduce);
      std::lock_guard lock(mu);
      CHECK(ran.calls[ar] == (Moe ? 1 + kConfig.layers : 1));
      CHECK(ran.bytes[ar] == bytes);
      CHECK(planned == bytes);
    });
  };
  check.operator()<Features>(8);
  check.operator()<PaddedFeatures>(16);
  // Each MoE block's router statistics: 2 E + 2 doubles.
  check.operator()<Features, true>(8 + kConfig.layers * (2 * kConfig.moe.experts + 2) * 8);
}

TEST_CASE("describe's rows count the expert axis's collectives as a step makes them, either dispatcher") {
  // One forward and backward on data 2 x expert 2: describe's expert-axis steps against the expert
  // group's counters, per operation (all_gather counted by its output, the others by their input,
  // as the counters do). The all-gather dispatcher's bytes do not depend on the routing: exact.
  // The all-to-all's rows do (describe gives them at balance): its calls, and the counts' bytes.
  auto check = [&]<class Dsp>() {
    INFO(Dsp::name());
    using Model = nn::StagedModel<test::feature::Spec<false, context::None, Features, double, Host, true, Dsp>>;
    std::mutex mu;
    run_threads(2, [&](ThreadComm& world) {
      Host h;
      Mesh mesh{world, {.data = 2, .expert = 2}};
      Model model(h, kConfig, mesh.spread(), kMicro);
      threads::Counters planned;
      for (const nn::CommRow& row : nn::walked_comm_rows(model, kMicro, mesh.spread()))
        for (const auto* steps : {&row.forward, &row.backward})
          for (const CommStep& st : *steps) {
            if (st.axis != Axis::expert) continue;
            const auto op = st.collective == Collective::all_gather       ? threads::Op::all_gather
                            : st.collective == Collective::reduce_scatter ? threads::Op::reduce_scatter
                                                                          : threads::Op::all_to_all;
            planned.calls[static_cast<std::size_t>(op)] += 1;
            planned.bytes[static_cast<std::size_t>(op)] +=
                static_cast<std::uint64_t>(st.collective == Collective::all_gather ? st.bytes_out : st.bytes_in);
          }
      FeatureBatches batches(kConfig, kMicro, 2, mesh.coord().data, 1);
      auto ctx = model.in_flight(batches.next(0, 0, 1.0));
      const threads::Counters before = mesh.comm(Axis::expert).counters();
      pipeline::forward(model, ctx, mesh);
      pipeline::backward(model, ctx, mesh);
      const threads::Counters ran = mesh.comm(Axis::expert).counters() - before;
      std::lock_guard lock(mu);
      for (const auto op : {threads::Op::all_gather, threads::Op::reduce_scatter, threads::Op::all_to_all}) {
        INFO(threads::name(op));
        CHECK(ran.calls_of(op) == planned.calls_of(op));
        if constexpr (std::same_as<Dsp, nn::AllGatherDispatch>) CHECK(ran.bytes_of(op) == planned.bytes_of(op));
      }
      if constexpr (std::same_as<Dsp, nn::AllGatherDispatch>)
        CHECK(ran.calls_of(threads::Op::all_gather) == 4 * static_cast<std::uint64_t>(kConfig.layers));
      else CHECK(ran.calls_of(threads::Op::all_to_all) == 5 * static_cast<std::uint64_t>(kConfig.layers));
    });
  };
  check.operator()<nn::AllGatherDispatch>();
  check.operator()<nn::AllToAllDispatch>();
}

// A mixture of experts in every block (nn/moe.hpp): Spec<..., Moe>.
TEST_CASE("a mixture-of-experts model on every layout equals one rank in f64 (1e-12): loss, gradients and weights") {
  // The router's statistics are summed over the data, context and (SP) tensor ranks, so that every
  // layout computes the same router losses; capacity per sample, so that data and pipe drop alike.
  const test::StepsRun ref = run<false, context::None, optim::Ddp, Features, true>(1, 1, 1, 1);
  check_equal(run<false, context::None, optim::Ddp, Features, true>(1, 1, 1, 2), ref, "MoE: tensor 2");
  check_equal(run<true, context::None, optim::Ddp, Features, true>(1, 1, 1, 2), ref, "MoE: tensor 2, SP");
  check_equal(run<false, context::None, optim::Ddp, Features, true>(2, 1, 1, 1), ref, "MoE: DDP over data 2");
  check_equal(run<false, context::None, optim::Fsdp, Features, true>(2, 1, 1, 1), ref, "MoE: FSDP over data 2", true);
  check_equal(run<false, context::None, optim::Ddp, Features, true>(1, 2, 1, 1), ref, "MoE: 1F1B over pipe 2");
  check_equal(run<false, context::Ring, optim::Ddp, Features, true>(1, 1, 2, 1), ref, "MoE: context 2 (ring)");
  check_equal(run<true, context::Ring, optim::Ddp, Features, true>(2, 2, 2, 2), ref,
              "MoE: data 2 x pipe 2 x context 2 x tensor 2 with SP");
  Config capped = kConfig;
  capped.moe.capacity_factor = 1.0;  // ceil(1.0 x 8 x 2 / 4) = 4 slots a sample per expert
  const test::StepsRun cref = run<false, context::None, optim::Ddp, Features, true>(1, 1, 1, 1, capped);
  check_equal(run<false, context::None, optim::Ddp, Features, true>(2, 1, 1, 1, capped), cref, "MoE capped: data 2");
  check_equal(run<false, context::None, optim::Ddp, Features, true>(1, 2, 1, 2, capped), cref,
              "MoE capped: pipe 2 x tensor 2");
  CHECK(std::abs(cref.losses[1] - ref.losses[1]) > 1e-6);  // the capacity dropped tokens
}

// Expert parallelism: the experts of every block sharded over an expert group carved from the data
// x context ranks (comm/mesh.hpp), their gradients reduced over the expert-data group only
// (optim/data_parallel.hpp, a unit of their own), the tokens exchanged (nn/expert_dispatch.hpp).
TEST_CASE("an MoE model with expert parallelism equals one rank in f64 (1e-12): loss, gradients and weights") {
  using Cx = context::None;
  const test::StepsRun ref = run<false, Cx, optim::Ddp, Features, true>(1, 1, 1, 1);
  check_equal(run<false, Cx, optim::Ddp, Features, true>(2, 1, 1, 1, kConfig, 2), ref, "MoE: expert 2 (data 2), DDP");
  check_equal(run<false, Cx, optim::Ddp, Features, true>(4, 1, 1, 1, kConfig, 4), ref, "MoE: expert 4 (data 4), DDP");
  check_equal(run<false, Cx, optim::Ddp, Features, true>(4, 1, 1, 1, kConfig, 2), ref,
              "MoE: expert 2 x expert-data 2 (data 4), DDP");
  check_equal(run<false, Cx, optim::Fsdp, Features, true>(4, 1, 1, 1, kConfig, 2), ref,
              "MoE: expert 2 x expert-data 2 (data 4), FSDP", true);
  check_equal(run<false, Cx, optim::Zero2, Features, true>(4, 1, 1, 1, kConfig, 2), ref,
              "MoE: expert 2 x expert-data 2 (data 4), ZeRO-2", true);
  check_equal(run<true, Cx, optim::Zero1, Features, true>(2, 2, 1, 2, kConfig, 2), ref,
              "MoE: expert 2 (data 2) x tensor 2 with SP x pipe 2, ZeRO-1", true);
  check_equal(run<false, context::Ring, optim::Ddp, Features, true>(1, 1, 2, 1, kConfig, 2), ref,
              "MoE: expert 2 over context 2 (ring)");
  check_equal(run<true, context::Ring, optim::Ddp, Features, true>(2, 1, 2, 2, kConfig, 4), ref,
              "MoE: expert 4 over data 2 x context 2, tensor 2 with SP");
  Config capped = kConfig;
  capped.moe.capacity_factor = 1.0;
  const test::StepsRun cref = run<false, Cx, optim::Ddp, Features, true>(1, 1, 1, 1, capped);
  check_equal(run<false, Cx, optim::Ddp, Features, true>(2, 2, 1, 1, capped, 2), cref,
              "MoE capped: expert 2 (data 2) x pipe 2");
}

// Aux-loss-free balancing (DeepSeek-V3): sigmoid scores, an expert bias on the choice, moved by its
// sign step in the optimizer step (nn::SignStep) from the load summed over every micro-batch and rank.
TEST_CASE(
    "an MoE model with sigmoid scores and an expert bias equals one rank on every layout, the bias moved by "
    "its sign step") {
  using Cx = context::None;
  Config b = kConfig;
  b.moe.score = nn::Score::sigmoid;
  b.moe.z_coef = 0;
  b.moe.scale = 2.5;
  b.moe.expert_bias = true;
  b.moe.bias_rate = 0.05;  // large, so that the second step routes by it
  const test::StepsRun ref = run<false, Cx, optim::Ddp, Features, true>(1, 1, 1, 1, b);
  // One step: every bias is -rate sign(E (slots chosen) - N k), its buffer's load, which sums to 0
  // over the experts (exact integers: each step's 2 micro-batches of 4 x 8 tokens, top 2 of 4).
  const auto one =
      test::train_steps<Regressor<false, Cx, Features, true>, pipeline::OneFOneB, optim::Ddp, FeatureBatches>(
          b, kMicro, kM, 1, 1, 1, 1, 1);
  int biases = 0, moved = 0;
  for (const auto& [name, load] : one.grads) {
    if (!name.ends_with("router.bias")) continue;
    ++biases;
    double sum = 0;
    for (std::size_t e = 0; e < load.size(); ++e) {
      CHECK(load[e] == std::round(load[e]));
      sum += load[e];
      const double want = load[e] > 0 ? -0.05 : load[e] < 0 ? 0.05 : 0.0;
      CHECK(one.values.at(name)[e] == want);
      moved += load[e] != 0;
    }
    CHECK(sum == 0);
  }
  CHECK(biases == kConfig.layers);
  CHECK(moved > 0);
  // Two steps: each bias a sum of two steps of 0.05.
  for (const auto& [name, v] : ref.values)
    if (name.ends_with("router.bias"))
      for (double x : v) CHECK(std::abs(x / 0.05 - std::round(x / 0.05)) <= 1e-12);
  Config fixed = b;
  fixed.moe.bias_rate = 0;  // held at 0: the second step routes otherwise
  CHECK(std::abs(run<false, Cx, optim::Ddp, Features, true>(1, 1, 1, 1, fixed).losses[1] - ref.losses[1]) > 1e-9);
  check_equal(run<false, Cx, optim::Ddp, Features, true>(2, 1, 1, 1, b, 2), ref, "balanced: expert 2 (data 2), DDP");
  check_equal(run<false, Cx, optim::Fsdp, Features, true>(4, 1, 1, 1, b, 2), ref,
              "balanced: expert 2 x expert-data 2 (data 4), FSDP", true);
  check_equal(run<true, Cx, optim::Zero1, Features, true>(2, 2, 1, 2, b, 2), ref,
              "balanced: expert 2 (data 2) x tensor 2 with SP x pipe 2, ZeRO-1", true);
  check_equal(run<true, context::Ring, optim::Zero2, Features, true>(2, 1, 2, 2, b, 4), ref,
              "balanced: expert 4 over data 2 x context 2, tensor 2 with SP, ZeRO-2", true);
}

TEST_CASE("an MoE model with expert parallelism under every recompute policy: the gradients of no recompute") {
  // Full recompute re-runs each block's forward in backward, its routing, its router statistics'
  // all-reduce and its exchange with it: the same inputs give the same routing and the same sizes
  // on every rank, so the re-run's collectives match and the gradients are bitwise those without.
  const auto go = [&]<recompute::Policy Rc, class Dsp>(int data, int pipe, int tensor, int expert) {
    using Model = nn::StagedModel<test::feature::Spec<true, context::None, Features, double, Host, true, Dsp, Rc>>;
    return test::train_steps<Model, pipeline::OneFOneB, optim::Ddp, FeatureBatches>(kConfig, kMicro, kM, pipe, 1,
                                                                                    tensor, data, 2, 1, expert);
  };
  const test::StepsRun ref = run<false, context::None, optim::Ddp, Features, true>(1, 1, 1, 1);
  for (const auto [data, pipe, tensor, expert] : {std::array{2, 1, 2, 2}, std::array{4, 2, 1, 4}}) {
    INFO("data ", data, " x pipe ", pipe, " x tensor ", tensor, " (SP), expert ", expert);
    const auto none = go.operator()<recompute::None, nn::AllToAllDispatch>(data, pipe, tensor, expert);
    check_equal(none, ref, "MoE with SP, no recompute");
    for (const auto& got : {go.operator()<recompute::Full, nn::AllToAllDispatch>(data, pipe, tensor, expert),
                            go.operator()<recompute::Selective, nn::AllToAllDispatch>(data, pipe, tensor, expert),
                            go.operator()<recompute::Full, nn::AllGatherDispatch>(data, pipe, tensor, expert)}) {
      CHECK(got.losses == none.losses);
      CHECK(got.grads == none.grads);
      CHECK(got.values == none.values);
    }
  }
}

TEST_CASE("an MoE model with the all-gather dispatcher equals one rank in f64 (1e-12)") {
  using Ag =
      nn::StagedModel<test::feature::Spec<false, context::None, Features, double, Host, true, nn::AllGatherDispatch>>;
  using AgSp =
      nn::StagedModel<test::feature::Spec<true, context::None, Features, double, Host, true, nn::AllGatherDispatch>>;
  const auto go = [&]<class Model, class Strategy>(int data, int pipe, int tensor, int expert) {
    return test::train_steps<Model, pipeline::OneFOneB, Strategy, FeatureBatches>(kConfig, kMicro, kM, pipe, 1, tensor,
                                                                                  data, 2, 1, expert);
  };
  const test::StepsRun ref = run<false, context::None, optim::Ddp, Features, true>(1, 1, 1, 1);
  check_equal(go.operator()<Ag, optim::Ddp>(4, 1, 1, 4), ref, "MoE, all-gather: expert 4 (data 4), DDP");
  check_equal(go.operator()<Ag, optim::Fsdp>(4, 1, 1, 2), ref, "MoE, all-gather: expert 2 x expert-data 2, FSDP", true);
  check_equal(go.operator()<AgSp, optim::Zero1>(2, 2, 2, 2), ref,
              "MoE, all-gather: expert 2 (data 2) x tensor 2 with SP x pipe 2, ZeRO-1", true);
}

TEST_CASE(
    "a block's experts are a unit of their own, reduced over the expert-data group, and a mixed unit is refused") {
  run_threads(4, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {.data = 4, .expert = 2}};
    CHECK(mesh.comm(Axis::expert).size() == 2);
    CHECK(mesh.expert_data().size() == 2);
    CHECK(mesh.coord().expert == world.rank() % 2);
    CHECK(mesh.comm(Axis::expert).rank() == world.rank() % 2);
    CHECK(mesh.expert_data().rank() == world.rank() / 2);
    Regressor<false, context::None, Features, true> model(h, kConfig, mesh.spread(), kMicro);
    std::vector<std::string> names;
    for (auto& u : model.units()) {
      names.push_back(u.name() + (u.experts() ? " (experts)" : ""));
      for (const auto& e : u.entries())
        CHECK_MESSAGE(u.experts() == (e.name.find(".experts.") != std::string::npos), e.name);
    }
    CHECK(names ==
          std::vector<std::string>{"embedding", "h0", "h0.experts (experts)", "h1", "h1.experts (experts)", "head"});
    CHECK(model.units_of(1) == std::vector<std::size_t>{1, 2});
    auto& moe = std::get<1>(std::get<1>(model.blocks[0].layers).inner.layers);
    nn::Unit<double, Host> mixed("mixed", h);
    mixed.add_param("router", moe.router);
    CHECK_THROWS_WITH_AS(mixed.add_param("gate_up", moe.gate_up),
                         "Unit mixed: gate_up lies on the expert axis and router does not; keep a layer's experts in "
                         "a unit of their own (Unit::add_part)",
                         Error);
  });
}

TEST_CASE("an expert degree that does not divide the data x context ranks, or the experts, is refused by name") {
  run_threads(2, [&](ThreadComm& world) {
    CHECK_THROWS_WITH_AS((Mesh{world, {.data = 2, .expert = 4}}),
                         "Mesh: expert degree 4 for data 2: the expert groups are carved from the 2 data ranks; "
                         "choose an expert degree that divides 2 (one of 1, 2)",
                         Error);
  });
  run_threads(1, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {}};
    Spread s = mesh.spread();
    s.expert_degree = 3;
    CHECK_THROWS_WITH_AS((Regressor<false, context::None, Features, true>(h, kConfig, s, kMicro)),
                         "MoeMlp: 4 experts over an expert degree of 3; choose an expert degree that divides the 4 "
                         "experts",
                         Error);
  });
}

TEST_CASE("a micro-batch's weight scales every gradient of an MoE model, the router losses' too") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Regressor<false, context::None, Features, true> model(h, kConfig, mesh.spread(), kMicro);
    FeatureBatches batches(kConfig, kMicro, 1, 0, 1);
    auto mb = batches.next(0, 0, 1.0);
    auto grads = [&](double scale) {
      mb.grad_scale = scale;
      model.zero_grad();
      auto ctx = model.in_flight(mb);
      pipeline::forward_backward(model, ctx, mesh);
      std::map<std::string, std::vector<double>> g;
      model.for_each_param(
          [&](const std::string& name, auto& p) { g[name].assign(p.grad.data(), p.grad.data() + p.grad.numel()); });
      return g;
    };
    const auto whole = grads(1.0), half = grads(0.5);
    // Halving is exact in binary floating point: every gradient is linear in the scale.
    for (const auto& [name, g] : whole) {
      INFO(name);
      std::vector<double> want(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) want[i] = 0.5 * g[i];
      CHECK(half.at(name) == want);
    }
    double router = 0;
    int routers = 0;
    for (const auto& [name, g] : whole)
      if (name.find(".router.weight") != std::string::npos) {
        ++routers;
        for (double v : g) router = std::max(router, std::abs(v));
      }
    CHECK(routers == kConfig.layers);
    CHECK(router > 0);
  });
}

TEST_CASE("an MoE model's gradients match finite differences of its loss plus the router losses on one rank") {
  // The MoE's router (1), experts (2) in place of the MLP's 4: 2 + 2 x 9 + 4 parameters.
  CHECK(check_finite_differences<Regressor<false, context::None, Features, true>, Features>() == 2 + 2 * 9 + 4);
}
