// Training steps on the host at GPT-2 124M widths (C=768, 12 heads, V=50304; fewer layers and a
// shorter sequence than GPT-2 so that a step takes seconds on a laptop-class machine): tokens/s
// and MFU, next to the Eigen GEMM rate of the same GEMM shapes measured in the same run, and the
// share of the step spent outside those GEMMs. One JSON object per line.
//
//   train_step [--layers L] [--seq T] [--batch B] [--tensor N] [--steps S]
#include <weft/weft_host.hpp>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <weft/nn/gpt.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/train/metrics.hpp>

using namespace weft;
using Clock = std::chrono::steady_clock;

namespace {

struct GemmShape {
  std::int64_t m, n, k;
  int count;  // how many per step (forward and backward)
};

// Seconds for the GEMMs of one training step, each shape timed alone on `ranks` threads at once.
double gemm_seconds(const std::vector<GemmShape>& shapes, int ranks, double& flops) {
  double total = 0;
  flops = 0;
  for (const GemmShape& s : shapes) {
    std::vector<double> t(static_cast<std::size_t>(ranks));
    run_threads(ranks, [&](ThreadComm& c) {
      std::vector<float> a(static_cast<std::size_t>(s.m * s.k), 0.5f), b(static_cast<std::size_t>(s.k * s.n), 0.5f),
          out(static_cast<std::size_t>(s.m * s.n));
      host::gemm<float>(host::Trans::no, host::Trans::no, s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), s.n, 0.f, out.data(), s.n);
      c.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < 3; ++i)
        host::gemm<float>(host::Trans::no, host::Trans::no, s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), s.n, 0.f, out.data(), s.n);
      t[static_cast<std::size_t>(c.rank())] = std::chrono::duration<double>(Clock::now() - t0).count() / 3;
    });
    double slowest = 0;
    for (double x : t) slowest = std::max(slowest, x);
    total += slowest * s.count;
    flops += 2.0 * static_cast<double>(s.m * s.n * s.k) * s.count * ranks;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t layers = 2, seq = 128, batch = 4, steps = 3;
  int tensor = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const auto v = std::stoll(argv[i + 1]);
    if (a == "--layers") layers = v;
    else if (a == "--seq") seq = v;
    else if (a == "--batch") batch = v;
    else if (a == "--tensor") tensor = static_cast<int>(v);
    else if (a == "--steps") steps = v;
    else {
      std::fprintf(stderr, "train_step: unknown option %s; use --layers --seq --batch --tensor --steps\n", a.c_str());
      return 2;
    }
  }
  const nn::GptConfig cfg{.vocab = 50304, .seq = seq, .layers = layers, .heads = 12, .width = 768};
  try {
    double step_seconds = 0;
    std::mutex mu;
    run_threads(tensor, [&](ThreadComm& world) {
      Mesh mesh{world, {.tensor = tensor}};
      Host host;
      nn::Gpt<float> gpt(host, cfg, mesh.spread(), batch);
      auto opt = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
      std::vector<std::int32_t> x(static_cast<std::size_t>(batch * seq)), y(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<std::int32_t>(weft::philox(1, 1, i)[0] % 50257);
        y[i] = static_cast<std::int32_t>(weft::philox(1, 2, i)[0] % 50257);
      }
      const auto step = [&] {  // one micro-batch, then the update with clipping at norm 1 (its norm included)
        opt.zero_grad();
        auto ctx = gpt.context({x, y, batch});
        pipeline::forward_backward(gpt, ctx, mesh, opt);
        opt.step(1e-4, 1.0);
      };
      step();  // warm-up
      world.barrier();
      const auto t0 = Clock::now();
      for (std::int64_t s = 0; s < steps; ++s) step();
      world.barrier();
      if (world.rank() == 0) {
        std::lock_guard lock(mu);
        step_seconds = std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(steps);
      }
    });
    // The GEMMs of one step on each rank: per layer qkv, proj, fc, mlp proj (forward, then two per
    // backward: input and weight gradients), and the tied LM head (forward, two backward).
    const std::int64_t N = batch * seq, C = 768, V = (50304 + tensor - 1) / tensor;
    std::vector<GemmShape> shapes;
    for (auto [out, in] : {std::pair{3 * C / tensor, C}, {C, C / tensor}, {4 * C / tensor, C}, {C, 4 * C / tensor}})
      shapes.push_back({N, out, in, static_cast<int>(3 * layers)});
    shapes.push_back({N, V, C, 3});
    double gemm_flops = 0;
    const double gemm_time = gemm_seconds(shapes, tensor, gemm_flops);
    const double tokens_s = static_cast<double>(N) / step_seconds;
    const double peak = train::gemm_rate<float>(tensor);
    const nlohmann::json j = {{"bench", "train_step"},
                              {"layers", layers}, {"width", 768}, {"heads", 12}, {"vocab", 50304}, {"seq", seq},
                              {"batch", batch}, {"tensor", tensor}, {"dtype", "f32"},
                              {"step_s", step_seconds}, {"tokens_per_s", tokens_s},
                              {"model_tflops", tokens_s * train::flops_per_token(cfg) / 1e12},
                              {"mfu", tokens_s * train::flops_per_token(cfg) / peak},
                              {"gemm_rate_gflops_256", peak / 1e9},
                              {"step_gemm_rate_gflops", gemm_flops / gemm_time / 1e9},
                              {"gemm_s_per_step", gemm_time},
                              {"share_outside_gemm", std::max(0.0, 1.0 - gemm_time / step_seconds)}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
