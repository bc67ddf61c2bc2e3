// The DiT family (models/dit/) against diffusers and against itself on every layout.
//
// diffusers: a DiTTransformer2DModel in float64 (tests/fixtures/dit_diffusers, written by
// tools/reference/dit_diffusers.py) imported into weft gives diffusers' predicted noise, loss and
// every parameter's gradient within 1e-10, on one rank and on tensor 2 x context 2 (ring, with
// sequence parallelism). Layouts: training steps on every layout equal one rank in f64 (1e-12).
// The objectives and the patch order against their definitions; bad inputs refused by name.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "support/error.hpp"
#include "support/gradcheck.hpp"
#include "support/train_steps.hpp"
#include "weft/checkpoint/checkpoint.hpp"
#include "weft/checkpoint/import_dir.hpp"
#include "weft/models/dit/diffusers.hpp"
#include "weft/models/dit/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/executor.hpp"

using namespace weft;

namespace {

std::string fixture() { return std::string(WEFT_TEST_DATA_DIR) + "/dit_diffusers"; }

std::string scratch(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / cat("weft_dit_", ::getpid(), "_", name);
  std::filesystem::remove_all(p);
  return p.string();
}

// The reference's inputs as a micro-batch of the whole batch (the test slices nothing: every data
// rank is one here).
struct Reference {
  checkpoint::ImportDir file{fixture(), "reference", "dit reference"};
  std::vector<double> x, target, sample, t_emb;
  std::vector<std::int32_t> y;
  double loss = 0;
  std::int64_t B = 0;
  explicit Reference(const dit::Config& c) {
    const auto img = file.read("x"), tgt = file.read("target"), out = file.read("sample"), t = file.read("timestep"),
               labels = file.read("labels");
    B = static_cast<std::int64_t>(labels.size());
    x.resize(img.size());
    target.resize(img.size());
    sample.resize(img.size());
    dit::patchify(x.data(), img.data(), B, c.in_channels, c.sample, c.sample, c.patch);
    dit::patchify(target.data(), tgt.data(), B, c.in_channels, c.sample, c.sample, c.patch);
    dit::patchify(sample.data(), out.data(), B, c.in_channels, c.sample, c.sample, c.patch);
    t_emb = dit::timestep_features(t, c.frequencies);
    for (double l : labels) y.push_back(static_cast<std::int32_t>(l));
    loss = file.read("loss")[0];
  }
  nn::Batch<dit::Inputs<double>> batch() const { return {{x, t_emb, y, target}, B, 1.0}; }
};

// max |a - b| / max |b|.
double relative(std::span<const double> a, std::span<const double> b) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = test::worse(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return worst / scale;
}

template <bool SP, class Cx>
void against_diffusers(int context, int tensor) {
  const std::string ckpt = scratch(cat("import_", context, "_", tensor));
  const dit::Config c = dit::import_diffusers(fixture(), ckpt);
  const Reference ref(c);
  // The reference's gradients in weft's layout: the import's own map over "grad.<name>".
  std::map<std::string, std::vector<double>> want;
  for (const auto& t : dit::diffusers_tensors(c, [&](const std::string& n) { return ref.file.read("grad." + n); })) {
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    std::vector<double> v(static_cast<std::size_t>(n));
    t.fill(v);
    want[t.name] = v;
  }
  std::mutex mu;
  std::map<std::string, std::vector<double>> got;
  std::vector<double> losses;
  double worst_pred = 0, worst_grad = 0;
  using Model = dit::Model<F64, SP, recompute::None, Host, Cx>;
  run_threads(context * tensor, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {.context = context, .tensor = tensor}};
    Model model(h, c, mesh.spread(), ref.B);
    auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{}, mesh);
    checkpoint::load(ckpt, model, dp, mesh, {.optimizer = false});
    const auto mb = ref.batch();
    {  // the predicted noise on this rank's rows
      auto ctx = model.in_flight(mb);
      pipeline::forward(model, ctx, mesh, pipeline::LocalGradients{}, nn::Mode::train);
      const Spread s = mesh.spread();
      const std::int64_t F = c.patch_features(), Tl = ctx.head.n / ref.B;
      const auto pos = nn::row_positions<typename dit::Spec<F64, SP, recompute::None, Host, Cx>::A>(s, c.seq, Tl);
      const auto* pred = static_cast<const double*>(ctx.head.pred.data());
      double worst = 0;
      for (std::int64_t b = 0; b < ref.B; ++b)
        for (std::int64_t t = 0; t < Tl; ++t)
          for (std::int64_t f = 0; f < F; ++f)
            worst = test::worse(worst, std::abs(pred[(b * Tl + t) * F + f] -
                                                ref.sample[static_cast<std::size_t>((b * c.seq + pos.at(t)) * F + f)]));
      std::lock_guard lock(mu);
      worst_pred = std::max(worst_pred, worst);
      CHECK_MESSAGE(worst <= 1e-10, "predicted noise, rank ", world.rank());  // f64 against f64: sums reordered
    }
    dp.zero_grad();
    auto ctx = model.in_flight(mb);
    const double loss = pipeline::forward_backward(model, ctx, mesh, dp, true);
    model.for_each_param([&](const std::string& name, auto& p) {
      const auto t = redistribute<Replicated>(p.grad, mesh);
      std::vector<double> g(t.data(), t.data() + t.numel());
      std::lock_guard lock(mu);
      if (world.rank() == 0) got[name] = g;
    });
    std::lock_guard lock(mu);
    if (world.rank() == 0) losses.push_back(loss);
  });
  std::filesystem::remove_all(ckpt);
  REQUIRE(losses.size() == 1);
  CHECK(std::abs(losses[0] - ref.loss) <= 1e-10 * ref.loss);  // NaN fails: the comparison is false
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    INFO(name);
    REQUIRE(got.contains(name));
    double largest = 0;
    for (double v : w) largest = std::max(largest, std::abs(v));
    CHECK(largest > 0);  // every parameter carries a gradient here (no adaLN-Zero zeros)
    const double r = relative(got[name], w);
    worst_grad = std::max(worst_grad, r);
    CHECK(r <= 1e-10);  // f64 against f64: the same sums in other orders
  }
  MESSAGE("context ", context, " x tensor ", tensor, ": predicted noise within ", worst_pred, ", loss ",
          std::abs(losses[0] - ref.loss) / ref.loss, " relative, worst gradient ", worst_grad, " relative");
}

}  // namespace

TEST_CASE("DiT against diffusers' DiTTransformer2DModel in f64: predicted noise, loss, every gradient (1e-10)") {
  against_diffusers<false, context::None>(1, 1);
}

TEST_CASE("DiT against diffusers on tensor 2 x context 2 (ring, sequence parallelism): the same, 1e-10") {
  against_diffusers<true, context::Ring>(2, 2);
}

namespace {

// The family's synthetic latents, as test::train_steps builds a batch source: rectified flow where
// the config's seed is odd (the layouts' config), DDPM otherwise.
struct LatentBatches : dit::SyntheticLatents<double> {
  LatentBatches(const dit::Config& c, std::int64_t micro, int data, int data_rank, int m)
      : dit::SyntheticLatents<double>(c,
                                      c.seed % 2 ? dit::Objective{dit::RectifiedFlow{}} : dit::Objective{dit::Ddpm{}},
                                      micro, data, data_rank, m) {}
};

dit::Config layouts_config() {
  dit::Config c;        // 16 patches of 16 features, blocks of 4 heads
  c.layers = 4;         // interleaved: 2 pipe ranks x 2 virtual stages
  c.zero_init = false;  // every path carries a gradient from the first step
  c.init_std = 0.2;
  c.seed = 7;  // odd: rectified flow
  return c;
}

template <bool SP, class Cx = context::None, class Sched = pipeline::OneFOneB, class Strategy = optim::Ddp,
          class R = recompute::None>
test::StepsRun dit_steps(int data, int pipe, int context, int tensor, int v = 1) {
  return test::train_steps<dit::Model<F64, SP, R, Host, Cx>, Sched, Strategy, LatentBatches>(
      layouts_config(), 4, 2, pipe, v, tensor, data, 2, context);
}

void same_run(const test::StepsRun& got, const test::StepsRun& ref, const std::string& what, bool grads = true) {
  INFO(what);
  // f64: the same sums in other orders (tensor and data reductions, the context blocks' merge, the
  // side input's shares over tensor ranks and pipe stages).
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    CHECK(std::abs(got.losses[i] - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]));
  std::string where;
  if (grads) CHECK_MESSAGE(test::worst_tensor(got.grads, ref.grads, where) <= 1e-12, "gradient ", where);
  REQUIRE(got.values.size() == ref.values.size());
  for (const auto& [name, want] : ref.values) {
    INFO(name);
    REQUIRE(got.values.contains(name));
    const auto& v = got.values.at(name);
    REQUIRE(v.size() == want.size());
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      worst = test::worse(worst, std::abs(v[i] - want[i])), scale = std::max(scale, std::abs(want[i]));
    // The keys' bias has no gradient but rounding (softmax is unchanged by a shift common to every
    // key), which AdamW divides by its eps (1e-8): its values move by lr x rounding / eps, to
    // 1e-10 of the layout. Every other tensor to 1e-12.
    CHECK(worst / scale <= (name.ends_with("attn.qkv.bias") ? 1e-9 : 1e-12));
  }
}

}  // namespace

TEST_CASE("DiT on every layout equals one rank in f64 (1e-12): losses, gradients and weights after two steps") {
  const test::StepsRun ref = dit_steps<false>(1, 1, 1, 1);
  REQUIRE(ref.losses.size() == 2);
  CHECK(std::isfinite(ref.losses[0]));
  CHECK(ref.losses[1] < ref.losses[0]);  // the step learns (AdamW at 1e-2, the same batch statistics)
  same_run(dit_steps<false>(1, 1, 1, 2), ref, "tensor 2");
  same_run(dit_steps<true>(1, 1, 1, 2), ref, "tensor 2 with sequence parallelism");
  same_run(dit_steps<false>(2, 1, 1, 1), ref, "DDP over data 2");
  same_run(dit_steps<false, context::None, pipeline::OneFOneB, optim::Zero1>(2, 1, 1, 1), ref, "ZeRO-1 over data 2",
           false);
  same_run(dit_steps<false, context::None, pipeline::OneFOneB, optim::Fsdp>(2, 1, 1, 1), ref, "FSDP over data 2",
           false);
  same_run(dit_steps<false>(1, 2, 1, 1), ref, "1F1B over pipe 2");
  same_run(dit_steps<false, context::None, pipeline::ZeroBubbleH1>(1, 2, 1, 1), ref, "ZB-H1 over pipe 2");
  same_run(dit_steps<false, context::None, pipeline::Interleaved>(1, 2, 1, 1, 2), ref, "interleaved over pipe 2 x 2");
  same_run(dit_steps<false, context::Ring>(1, 1, 2, 1), ref, "context 2 (ring)");
  same_run(dit_steps<false, context::AllGather>(1, 1, 2, 1), ref, "context 2 (all-gather)");
  same_run(dit_steps<false, context::None, pipeline::OneFOneB, optim::Ddp, recompute::Full>(1, 1, 1, 2), ref,
           "tensor 2, full recompute");
  same_run(dit_steps<true, context::None, pipeline::OneFOneB, optim::Ddp, recompute::Selective>(1, 1, 1, 2), ref,
           "tensor 2 with SP, selective recompute");
  same_run(dit_steps<true, context::Ring>(2, 2, 2, 2), ref, "data 2 x pipe 2 x context 2 x tensor 2 with SP");
}

TEST_CASE("DiT's objectives: DDPM's schedule against diffusers' DDPMScheduler, x_t and targets by definition") {
  const checkpoint::ImportDir file{fixture(), "reference", "dit reference"};
  const auto want = file.read("alphas_cumprod");
  const auto abar = dit::Ddpm{}.alpha_bar();
  REQUIRE(abar.size() == 1000);
  double worst = 0;
  for (std::size_t t = 0; t < abar.size(); ++t) worst = test::worse(worst, std::abs(abar[t] - want[t]) / want[t]);
  // diffusers' betas and products in float32: 1000 roundings of 6e-8 at most, relative.
  CHECK(worst <= 1e-4);
  CHECK(dit::Ddpm{}.step_at(0.25) == 250);
  CHECK(dit::Ddpm{}.step_at(0.9999) == 999);

  dit::Config c;
  const std::int64_t B = 3, P = c.in_channels * c.sample * c.sample;
  const auto x0 = test::normals(static_cast<std::size_t>(B * P), 5);
  const std::vector<std::int32_t> labels{0, 10, 4};
  const std::vector<double> u{0.0, 0.5, 0.75};
  const std::vector<std::uint64_t> seeds{1, 2, 3};
  for (const bool flow : {false, true}) {
    INFO((flow ? "rectified flow" : "DDPM"));
    dit::Noised<double> n;
    n.noise(c, flow ? dit::Objective{dit::RectifiedFlow{}} : dit::Objective{dit::Ddpm{}}, x0, labels, u, seeds);
    std::vector<double> xt(x0.size()), tgt(x0.size());
    dit::unpatchify(xt.data(), n.x.data(), B, c.in_channels, c.sample, c.sample, c.patch);
    dit::unpatchify(tgt.data(), n.target.data(), B, c.in_channels, c.sample, c.sample, c.patch);
    double err = 0, spread = 0;
    for (std::int64_t b = 0; b < B; ++b) {
      const auto k = static_cast<std::size_t>(b);
      const double s = u[k], a = abar[static_cast<std::size_t>(dit::Ddpm{}.step_at(s))];
      for (std::int64_t i = 0; i < P; ++i) {
        const auto at = static_cast<std::size_t>(b * P + i);
        // DDPM: the target is eps; rectified flow: the velocity eps - x0, so eps = target + x0.
        const double eps = flow ? tgt[at] + x0[at] : tgt[at];
        const double expect = flow ? (1 - s) * x0[at] + s * eps : std::sqrt(a) * x0[at] + std::sqrt(1 - a) * eps;
        err = test::worse(err, std::abs(xt[at] - expect));
        spread += eps * eps / static_cast<double>(B * P);
      }
      const double t = flow ? 1000 * s : static_cast<double>(dit::Ddpm{}.step_at(s));
      const auto f = dit::timestep_features(std::span<const double>(&t, 1), c.frequencies);
      for (std::int64_t j = 0; j < c.frequencies; ++j)
        CHECK(n.t_emb[static_cast<std::size_t>(b * c.frequencies + j)] == f[static_cast<std::size_t>(j)]);
    }
    CHECK(err <= 1e-15);                 // the same products in double
    CHECK(std::abs(spread - 1) <= 0.1);  // the noise is standard normal (768 draws: 5 sigma)
    CHECK(n.y == labels);
  }
}

TEST_CASE("DiT's patches: diffusers' order (patch row-major, then row, column, channel) and back") {
  // One sample of 2 channels, 4 x 4, patches of 2: value 1000 c + 10 h + w.
  std::vector<double> img(32), patches(32), back(32);
  for (int ch = 0; ch < 2; ++ch)
    for (int h = 0; h < 4; ++h)
      for (int w = 0; w < 4; ++w) img[static_cast<std::size_t>((ch * 4 + h) * 4 + w)] = 1000 * ch + 10 * h + w;
  dit::patchify(patches.data(), img.data(), 1, 2, 4, 4, 2);
  // patch (0, 1) is the second: its features (r, q, c) from (h, w) = (r, 2 + q).
  const std::vector<double> second{2, 1002, 3, 1003, 12, 1012, 13, 1013};
  CHECK(std::vector<double>(patches.begin() + 8, patches.begin() + 16) == second);
  dit::unpatchify(back.data(), patches.data(), 1, 2, 4, 4, 2);
  CHECK(back == img);
}

TEST_CASE("DiT refuses by name: bad sizes, labels, fractions and diffusers directories") {
  dit::Config c;
  c.seq = 15;
  CHECK_THROWS_WITH_AS(dit::validate(c, {}, false, 4), doctest::Contains("set seq to (sample / patch)^2 = 16"), Error);
  c = {};
  Spread s;
  s.tensor_degree = 3;
  CHECK_THROWS_WITH_AS(dit::validate(c, s, false, 4), doctest::Contains("4 heads over a tensor degree of 3"), Error);
  s = {};
  s.context_degree = 16;
  CHECK_THROWS_WITH_AS(dit::validate(c, s, false, 4), doctest::Contains("16 patches over a context degree of 16"),
                       Error);
  CHECK_THROWS_WITH_AS(dit::preset("DiT-XXL/2"), doctest::Contains("no preset named 'DiT-XXL/2'"), Error);
  CHECK(dit::preset("DiT-XL/2").seq == 256);

  dit::Noised<double> n;
  const std::vector<double> x0(static_cast<std::size_t>(c.in_channels * c.sample * c.sample), 0.0);
  const std::vector<std::int32_t> one{3};
  const std::vector<std::uint64_t> seed{1};
  const std::vector<double> past{1.0};
  CHECK_THROWS_WITH_AS(n.noise(c, dit::Ddpm{}, x0, one, past, seed), doctest::Contains("sample 0 at the fraction 1"),
                       Error);
  const std::vector<double> ok{0.5};
  n.noise(c, dit::Ddpm{}, x0, one, ok, seed);
  auto in = n.inputs();
  const std::vector<std::int32_t> bad{11};
  in.y = bad;
  CHECK_THROWS_WITH_AS(in.check(c, 1, "here"), doctest::Contains("sample 0 has the label 11 of 10 classes"), Error);
  in = n.inputs();
  in.x = in.x.subspan(1);
  CHECK_THROWS_WITH_AS(in.check(c, 1, "here"), doctest::Contains("the field 'x' holds 255 values"), Error);

  // Directories: a learned variance, blocks whose embedders differ, a missing tensor.
  auto copy = [&](const std::string& name) {
    const std::string d = scratch(name);
    std::filesystem::create_directories(d);
    for (const char* f : {"config.json", "diffusion_pytorch_model.safetensors"})
      std::filesystem::copy_file(fixture() + "/" + f, d + "/" + f);
    return d;
  };
  {
    const std::string d = copy("sigma");
    std::string text = read_text_file(d + "/config.json", 1 << 16, "test");
    const std::string from = "\"out_channels\": null";
    text.replace(text.find(from), from.size(), "\"out_channels\": 8");
    std::ofstream(d + "/config.json", std::ios::trunc) << text;
    CHECK_THROWS_WITH_AS(dit::import_diffusers(d, d + "/out"),
                         doctest::Contains("has out_channels 8 for 4 in_channels"), Error);
    std::filesystem::remove_all(d);
  }
  {
    const std::string d = copy("layers");
    std::string text = read_text_file(d + "/config.json", 1 << 16, "test");
    const std::string from = "\"num_layers\": 2";
    text.replace(text.find(from), from.size(), "\"num_layers\": 3");
    std::ofstream(d + "/config.json", std::ios::trunc) << text;
    CHECK_THROWS_WITH_AS(dit::import_diffusers(d, d + "/out"),
                         doctest::Contains("has no tensor transformer_blocks.2.attn1.to_q.weight"), Error);
    std::filesystem::remove_all(d);
  }
  {
    const std::string d = copy("untied"), f = d + "/diffusion_pytorch_model.safetensors";
    const std::string name = "transformer_blocks.1.norm1.emb.class_embedder.embedding_table.weight";
    const auto h = checkpoint::read_header(f);
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(h.data_start + h.find(name)->begin));
    const double other = 0.125;
    io.write(reinterpret_cast<const char*>(&other), sizeof other);
    io.close();
    const std::string want = name + " differs from block 0's";
    CHECK_THROWS_WITH_AS(dit::import_diffusers(d, d + "/out"), doctest::Contains(want.c_str()), Error);
    std::filesystem::remove_all(d);
  }
  CHECK_THROWS_WITH_AS(dit::import_diffusers(scratch("none"), scratch("none_out")),
                       doctest::Contains("has no config.json"), Error);
}
