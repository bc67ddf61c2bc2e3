// Training steps on the host (by default at GPT-2 124M widths: C=768, 12 heads, V=50304; fewer
// layers and a shorter sequence than GPT-2 so that a step takes seconds on a laptop-class machine)
// on data x tensor thread ranks: the median step's tokens/s, effective GFLOP/s (6 N + 12 L C T per
// token) and MFU, next to the Eigen GEMM rate of the same GEMM shapes measured alone in the same
// run; the step broken down by op class (host::OpTimes, measured inside the step on every rank) and
// the share of the step outside GEMMs; the FLOPs per token counted, and the vector instructions it
// was compiled for ("simd"). One JSON object per line. benchmarks/vs_pytorch.py
// runs it beside PyTorch eager.
//
//   train_step [--layers L] [--width C] [--heads H] [--vocab V] [--seq T] [--batch B] [--data D] [--tensor N] [--steps
//   S]
//              [--threads N]   (one rank whose host ops use N threads: host::set_threads)
//              [--model llama --kv-heads K --hidden F]   (Llama's blocks: RMSNorm, rotary, GQA, SwiGLU, an
//                                                         untied head; models/llama)
//              [--model mixtral ... --experts E --top-k k [--expert N]]   (Mixtral's: Llama's with E
//                                                         SwiGLU experts of F, the top k, aux coefficient
//                                                         0.01; experts over N of the data ranks)
#include <weft/device/host/profile.hpp>
#include <weft/weft_host.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <weft/models/gpt2/model.hpp>
#include <weft/models/llama/model.hpp>
#include <weft/models/mixtral/family.hpp>  // mixtral::flops_per_token
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
      host::gemm<float>(host::Trans::no, host::Trans::no, s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), s.n, 0.f,
                        out.data(), s.n);
      c.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < 3; ++i)
        host::gemm<float>(host::Trans::no, host::Trans::no, s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), s.n, 0.f,
                          out.data(), s.n);
      t[static_cast<std::size_t>(c.rank())] = std::chrono::duration<double>(Clock::now() - t0).count() / 3;
    });
    double slowest = 0;
    for (double x : t) slowest = std::max(slowest, x);
    total += slowest * s.count;
    flops += 2.0 * static_cast<double>(s.m * s.n * s.k) * s.count * ranks;
  }
  return total;
}

// The widest vector instructions this binary was compiled for (-march): weft's own ops use these;
// the GEMM library picks its kernels at run time (gemm_library names them).
const char* simd() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__)
  return "avx2";
#elif defined(__AVX__)
  return "avx";
#else
  return "sse";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t layers = 2, seq = 128, batch = 4, steps = 3, width = 768, heads = 12, vocab = 50304, kv_heads = 0,
               hidden = 0, experts = 8, top_k = 2;
  int tensor = 1, data = 1, op_threads = 1, expert = 1;
  std::string model = "gpt2";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") {
      model = argv[i + 1];
      continue;
    }
    const auto v = std::stoll(argv[i + 1]);
    if (a == "--layers") layers = v;
    else if (a == "--kv-heads") kv_heads = v;
    else if (a == "--hidden") hidden = v;
    else if (a == "--seq") seq = v;
    else if (a == "--batch") batch = v;
    else if (a == "--width") width = v;
    else if (a == "--heads") heads = v;
    else if (a == "--vocab") vocab = v;
    else if (a == "--tensor") tensor = static_cast<int>(v);
    else if (a == "--data") data = static_cast<int>(v);
    else if (a == "--steps") steps = v;
    else if (a == "--threads") op_threads = static_cast<int>(v);
    else if (a == "--experts") experts = v;
    else if (a == "--top-k") top_k = v;
    else if (a == "--expert") expert = static_cast<int>(v);
    else {
      std::fprintf(
          stderr,
          "train_step: unknown option %s; use --model --layers --width --heads --kv-heads --hidden --vocab --seq "
          "--batch --data --tensor --steps --threads --experts --top-k --expert\n",
          a.c_str());
      return 2;
    }
  }
  if (model != "gpt2" && model != "llama" && model != "mixtral") {
    std::fprintf(stderr, "train_step: --model %s: use gpt2, llama or mixtral\n", model.c_str());
    return 2;
  }
  const bool is_moe = model == "mixtral", is_llama = model == "llama" || is_moe;
  const gpt2::Config cfg{.vocab = vocab, .seq = seq, .layers = layers, .heads = heads, .width = width};
  const llama::Config lcfg{.vocab = vocab,
                           .seq = seq,
                           .layers = layers,
                           .heads = heads,
                           .kv_heads = kv_heads > 0 ? kv_heads : heads,
                           .width = width,
                           .hidden = hidden > 0 ? hidden : 4 * width,
                           .rope = {.theta = 500000}};
  mixtral::Config mcfg;
  static_cast<llama::Config&>(mcfg) = lcfg;
  mcfg.experts = experts, mcfg.top_k = top_k, mcfg.aux_coef = 0.01;
  const double flops_per_token = is_moe     ? mixtral::flops_per_token(mcfg)
                                 : is_llama ? llama::flops_per_token(lcfg)
                                            : gpt2::flops_per_token(cfg);
  if (op_threads < 1 || op_threads > 256 || (op_threads > 1 && data * tensor != 1)) {
    std::fprintf(stderr,
                 "train_step: --threads %d: give 1 to 256, and more than 1 only to one rank (data 1, tensor 1)\n",
                 op_threads);
    return 2;
  }
  host::set_threads(op_threads);
  try {
    std::vector<double> step_seconds;
    std::mutex mu;
    const int ranks = data * tensor;
    std::vector<host::OpTimes> op_times(static_cast<std::size_t>(ranks));  // each rank's, over the timed steps
    // One rank's steps of `gpt` (GPT-2's or Llama's model, as --model says).
    const auto rank_steps = [&](ThreadComm& world, Mesh<ThreadComm>& mesh, auto& gpt) {
      auto opt = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
      const std::size_t n = static_cast<std::size_t>(batch / data * seq);
      std::vector<std::int32_t> x(n), y(n);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t at = static_cast<std::uint64_t>(mesh.coord().data) * n + i;
        x[i] = static_cast<std::int32_t>(weft::philox(1, 1, at)[0] % static_cast<std::uint64_t>(vocab));
        y[i] = static_cast<std::int32_t>(weft::philox(1, 2, at)[0] % static_cast<std::uint64_t>(vocab));
      }
      const auto step = [&] {  // one micro-batch, then the update with clipping at norm 1 (its norm included)
        opt.zero_grad();
        auto ctx = gpt.in_flight({{x, y}, batch});
        pipeline::forward_backward(gpt, ctx, mesh, opt);
        opt.step(1e-4, 1.0);
      };
      step();  // warm-up
      host::profile(&op_times[static_cast<std::size_t>(world.rank())]);
      for (std::int64_t s = 0; s < steps; ++s) {
        world.barrier();
        const auto t0 = Clock::now();
        step();
        world.barrier();
        if (world.rank() == 0) {
          std::lock_guard lock(mu);
          step_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
      }
      host::profile(nullptr);
    };
    run_threads(ranks, [&](ThreadComm& world) {
      Mesh mesh{world, {.data = data, .tensor = tensor, .expert = expert}};
      Host host;
      if (is_moe) {
        mixtral::validate(mcfg, mesh.spread(), false, batch);
        mixtral::Model<float> m(host, mcfg, mesh.spread(), batch);
        rank_steps(world, mesh, m);
      } else if (is_llama) {
        llama::validate(lcfg, mesh.spread(), false, batch);
        llama::Model<float> m(host, lcfg, mesh.spread(), batch);
        rank_steps(world, mesh, m);
      } else {
        gpt2::Model<float> m(host, cfg, mesh.spread(), batch);
        rank_steps(world, mesh, m);
      }
    });
    std::sort(step_seconds.begin(), step_seconds.end());
    const double step_s = step_seconds[step_seconds.size() / 2];  // the median
    // The GEMMs of one step on each rank: per layer qkv, proj, fc, mlp proj (Llama: qkv with its
    // key-value heads, o, gate_up, down; forward, then two per backward: input and weight
    // gradients), and the LM head (forward, two backward).
    const std::int64_t N = batch / data * seq, C = width, V = (vocab + tensor - 1) / tensor;
    std::vector<GemmShape> shapes;
    if (is_llama) {
      const std::int64_t qkv = C + 2 * lcfg.kv_heads * lcfg.head_dim(), F = lcfg.hidden;
      if (is_moe) {  // each expert's share of the N k slots at balance; the router
        for (auto [out, in] : {std::pair{qkv / tensor, C}, {C, C / tensor}, {experts, C}})
          shapes.push_back({N, out, in, static_cast<int>(3 * layers)});
        for (auto [out, in] : {std::pair{2 * F, C}, {C, F}})
          shapes.push_back({std::max<std::int64_t>(1, N * top_k / experts), out, in,
                            static_cast<int>(3 * layers * experts / expert)});
      } else {
        for (auto [out, in] : {std::pair{qkv / tensor, C}, {C, C / tensor}, {2 * F / tensor, C}, {C, F / tensor}})
          shapes.push_back({N, out, in, static_cast<int>(3 * layers)});
      }
    } else {
      for (auto [out, in] : {std::pair{3 * C / tensor, C}, {C, C / tensor}, {4 * C / tensor, C}, {C, 4 * C / tensor}})
        shapes.push_back({N, out, in, static_cast<int>(3 * layers)});
    }
    shapes.push_back({N, V, C, 3});
    double gemm_flops = 0;
    const double gemm_time = gemm_seconds(shapes, ranks, gemm_flops);
    const double tokens_s = static_cast<double>(batch * seq) / step_s;
    // The step by op class, per step, averaged over the ranks (each rank's ops run on its thread).
    nlohmann::json ops;
    double in_ops = 0, gemm_in_step = 0;
    for (std::size_t k = 0; k < host::kOps; ++k) {
      double t = 0;
      for (const host::OpTimes& r : op_times) t += r.seconds[k];
      t /= static_cast<double>(ranks * steps);
      ops[host::name(static_cast<host::Op>(k))] = t;
      in_ops += t;
      if (static_cast<host::Op>(k) == host::Op::gemm) gemm_in_step = t;
    }
    double mean_step = 0;
    for (double t : step_seconds) mean_step += t / static_cast<double>(step_seconds.size());
    ops["outside_ops"] = std::max(0.0, mean_step - in_ops);  // collectives, allocation, the framework
    const double peak = train::gemm_rate<float>(ranks);
    const nlohmann::json j = {{"bench", "train_step"},
                              {"impl", "weft"},
                              {"model", model},
                              {"layers", layers},
                              {"width", width},
                              {"heads", heads},
                              {"vocab", vocab},
                              {"seq", seq},
                              {"kv_heads", is_llama ? lcfg.kv_heads : heads},
                              {"hidden", is_llama ? lcfg.hidden : 4 * width},
                              {"experts", is_moe ? experts : 0},
                              {"top_k", is_moe ? top_k : 0},
                              {"expert", expert},
                              {"batch", batch},
                              {"data", data},
                              {"tensor", tensor},
                              {"threads", ranks * op_threads},
                              {"op_threads", op_threads},
                              {"dtype", "f32"},
                              {"step_s", step_s},
                              {"tokens_per_s", tokens_s},
                              {"flops_per_token", flops_per_token},
                              {"effective_gflops", tokens_s * flops_per_token / 1e9},
                              {"mfu", tokens_s * flops_per_token / peak},
                              {"gemm_ceiling_gflops", peak / 1e9},  // 512^3 GEMMs, every rank, best of 5 windows
                              {"gemm_library", host::gemm_library()},
                              {"simd", simd()},
                              {"step_gemm_rate_gflops", gemm_flops / gemm_time / 1e9},
                              {"isolated_gemm_s_per_step", gemm_time},
                              {"ops_s_per_step", ops},
                              {"share_outside_gemm", std::max(0.0, 1.0 - gemm_in_step / mean_step)}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
