// Training steps of GPT-2 124M on one GPU (T = 1024, bf16 mixed precision, AdamW, one rank), at the
// largest micro-batch of the candidates that fits: tokens/s, MFU against the GEMM ceiling measured
// in the same run and against the GPU's data-sheet dense peak, peak memory by category, and the
// share of the step in GEMMs, attention, other kernels and outside kernels (host work, copies,
// waits), from CUDA events around every op (a separate profiled step; the timed steps run without
// events). One rank, so no collective moves data: communication is measured by the multi-rank
// benchmarks. One JSON object per line.
//
//   gpt2 [--steps N] [--batch B] [--quick]   (--quick: 4 layers, T = 256, for a smoke run)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "weft/comm/gpu/thread_memory.cuh"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/data/loader.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/ops/all.cuh"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/executor.hpp"
#include "weft/train/cuda_metrics.cuh"
#include "weft/train/metrics.hpp"

using namespace weft;

namespace {

using Model = gpt2::Model<Bf16Mixed, false, recompute::None, Cuda>;

struct Result {
  std::int64_t batch = 0;
  double step_s = 0;
  std::array<double, 3> kernel_ms{};  // gemm, attention, other kernels in the profiled step
  double profiled_step_ms = 0;
  MemoryStats memory;
};

// Runs `steps` timed steps (after one warm-up and one profiled) at micro-batch B; nullopt when the
// model or its activations do not fit.
std::optional<Result> run(const gpt2::Config& cfg, std::int64_t B, int steps) {
  std::optional<Result> out;
  run_threads(1, [&](ThreadComm& world) {
    Cuda dev(0);
    world.set_memory(std::make_shared<threads::CudaMemory>(dev));
    Mesh mesh{world, {}};
    try {
      Model gpt(dev, cfg, mesh.spread(), B);
      auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
      const data::MarkovSource corpus(cfg.vocab, 1);
      data::Loader<data::MarkovSource> loader(corpus, cfg.seq, B, 1, 0);
      std::vector<std::int32_t> x, y;
      auto step = [&] {
        loader.next(x, y);
        dp.zero_grad();
        auto ctx = gpt.in_flight({{x, y}, B});
        pipeline::forward_backward(gpt, ctx, mesh, dp);
        dp.step(6e-4, 1.0);
        dev.synchronize();
      };
      step();  // warm-up: allocator pool, cuBLASLt heuristics
      Result r;
      r.batch = B;
      weft::cuda::Profile profile(dev);
      dev.profile = &profile;
      const auto p0 = std::chrono::steady_clock::now();
      step();
      r.profiled_step_ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
      r.kernel_ms = profile.collect();
      dev.profile = nullptr;
      dev.reset_peak();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) step();
      r.step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
      r.memory = dev.memory();
      out = r;
    } catch (const Error& e) {
      std::fprintf(stderr, "gpt2: micro-batch %lld does not fit: %s\n", static_cast<long long>(B), e.what());
    }
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5;
  std::vector<std::int64_t> batches{32, 16, 8, 4};
  gpt2::Config cfg{.vocab = 50257, .seq = 1024, .layers = 12, .heads = 12, .width = 768};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) batches = {std::atoll(argv[++i])};
    else if (!std::strcmp(argv[i], "--quick")) {
      cfg.layers = 4;
      cfg.seq = 256;
      steps = 2;
      batches = {8};
    } else {
      std::fprintf(stderr, "gpt2: unknown argument %s; use --steps N, --batch B, --quick\n", argv[i]);
      return 2;
    }
  }
  // Skip (77) only where there is no GPU; a GPU machine whose runtime fails is a failure, named.
  if (const weft::cuda::Probe found = weft::cuda::probe(); found.count == 0) {
    if (found.absent) {
      std::fprintf(stderr, "gpt2: no CUDA device on this machine\n");
      return 77;
    }
    std::fprintf(stderr, "gpt2: this machine has an NVIDIA driver but no usable CUDA device: %s\n", found.why.c_str());
    return 1;
  }
  Cuda probe(0);
  const double ceiling = train::cuda_gemm_rate<bf16>(probe, 8192);
  const auto peak = train::datasheet_peak(true);
  for (std::int64_t B : batches) {
    const auto r = run(cfg, B, steps);
    if (!r) continue;
    const double tokens_s = static_cast<double>(B * cfg.seq) / r->step_s;
    const double flops = gpt2::flops_per_token(cfg) * tokens_s;
    const double kernels = r->kernel_ms[0] + r->kernel_ms[1] + r->kernel_ms[2];
    nlohmann::json j{{"bench", "gpt2"},
                     {"layers", cfg.layers},
                     {"seq", cfg.seq},
                     {"dtype", "bf16"},
                     {"micro_batch", B},
                     {"step_ms", 1e3 * r->step_s},
                     {"tokens_per_s", tokens_s},
                     {"model_tflops", flops / 1e12},
                     {"gemm_ceiling_tflops", ceiling / 1e12},
                     {"mfu_of_gemm_ceiling", flops / ceiling},
                     {"gemm_share", r->kernel_ms[0] / r->profiled_step_ms},
                     {"attention_share", r->kernel_ms[1] / r->profiled_step_ms},
                     {"other_kernels_share", r->kernel_ms[2] / r->profiled_step_ms},
                     {"outside_kernels_share", 1.0 - kernels / r->profiled_step_ms}};
    if (peak) {
      j["datasheet_peak"] = peak->first;
      j["datasheet_peak_tflops"] = peak->second / 1e12;
      j["mfu"] = flops / peak->second;
    }
    nlohmann::json mem;
    for (std::size_t c = 0; c < kCategories; ++c) mem[name(static_cast<Category>(c))] = r->memory.peak[c];
    mem["total"] = r->memory.total_peak;
    j["peak_bytes"] = mem;
    std::printf("%s\n", j.dump().c_str());
    return 0;  // the largest candidate that fits
  }
  std::fprintf(stderr, "gpt2: no candidate micro-batch fits\n");
  return 1;
}
