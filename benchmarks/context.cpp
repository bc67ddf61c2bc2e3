// Context parallelism on thread ranks: a Llama step at sequence lengths 1K to 8K over context 1, 2
// and 4, ring and all-gather attention. Per run: the step time (one step after a warm-up, between
// barriers; c thread ranks on this host's cores), each rank's peak activation bytes and peak total
// (the host allocator's counts, which include the attention's travelling blocks), and the bytes the
// attention asked of the context axis in the step against their closed forms, a block being one
// rank's keys and values, B (T/c) KV 2 hd elements, per layer:
//   ring        sends (c - 1) blocks forward, (c - 1) blocks and c gradient blocks backward
//   all-gather  gathers c blocks forward and again backward (counted by output), reduce-scatters
//               c gradient blocks (counted by input)
// and what that puts on each rank's links with ring collectives (all-gather and reduce-scatter
// move (c - 1) / c of their c blocks). A context-1 run without context parallelism (the attention
// keeping its (T, T) probabilities) is the reference up to 4K. One JSON object per line.
//
//   context [--max-seq T] [--layers L]
#include <weft/weft_host.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <weft/comm/mesh.hpp>
#include <weft/models/llama/model.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/pipeline/executor.hpp>

using namespace weft;
using Clock = std::chrono::steady_clock;

namespace {

struct Result {
  double step_s = 0;
  std::int64_t activations = 0, peak = 0;  // the largest rank's
  threads::Counters context;               // rank 0's, on the context axis
};

template <class Cx>
Result run(const llama::Config& cfg, int c) {
  using Model = llama::Model<float, false, recompute::None, Host, false, Cx>;
  const std::int64_t micro = 1;
  Result out;
  std::vector<std::int64_t> act(static_cast<std::size_t>(c)), peak(act);
  run_threads(c, [&](ThreadComm& w) {
    Host dev;
    Mesh mesh{w, {.context = c}};
    Model model(dev, cfg, mesh.spread(), micro);
    auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{}, mesh);
    std::vector<std::int32_t> x(static_cast<std::size_t>(micro * cfg.seq)), y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<std::int32_t>((i * 7 + 3) % static_cast<std::size_t>(cfg.vocab));
      y[i] = static_cast<std::int32_t>((i * 5 + 1) % static_cast<std::size_t>(cfg.vocab));
    }
    const auto step = [&] {
      dp.zero_grad();
      auto ctx = model.in_flight({{x, y}, micro, 1.0});
      pipeline::forward_backward(model, ctx, mesh, dp, true);
      dp.step(1e-3, 1.0);
    };
    step();  // the first step allocates the lazily made buffers
    w.barrier();
    dev.reset_peak();
    const threads::Counters before = mesh.comm(Axis::context).counters();
    const auto t0 = Clock::now();
    step();
    w.barrier();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    act[static_cast<std::size_t>(w.rank())] = dev.memory().peak[static_cast<std::size_t>(Category::activations)];
    peak[static_cast<std::size_t>(w.rank())] = dev.memory().total_peak;
    if (w.rank() == 0) {
      out.step_s = s;
      out.context = mesh.comm(Axis::context).counters() - before;
    }
  });
  for (int r = 0; r < c; ++r) {
    out.activations = std::max(out.activations, act[static_cast<std::size_t>(r)]);
    out.peak = std::max(out.peak, peak[static_cast<std::size_t>(r)]);
  }
  return out;
}

void report(const char* attention, const llama::Config& cfg, int c, const Result& r, double reference_act) {
  const std::int64_t hd = cfg.width / cfg.heads, L = cfg.layers;
  const double block = 1.0 * (cfg.seq / c) * cfg.kv_heads * 2 * hd * sizeof(float);  // B = 1
  const bool ring = std::strcmp(attention, "ring") == 0, none = std::strcmp(attention, "none") == 0;
  const auto bytes = [&](threads::Op op) { return static_cast<double>(r.context.bytes_of(op)); };
  const double counted = bytes(threads::Op::send) + bytes(threads::Op::all_gather) + bytes(threads::Op::reduce_scatter);
  // (Ring on one rank sends nothing: its block never leaves.)
  const double predicted = none || (ring && c == 1) ? 0 : ring ? L * (3.0 * c - 2) * block : L * 3.0 * c * block;
  const double wire =
      bytes(threads::Op::send) + (bytes(threads::Op::all_gather) + bytes(threads::Op::reduce_scatter)) * (c - 1) / c;
  nlohmann::json j{{"bench", "context"},
                   {"seq", cfg.seq},
                   {"context", c},
                   {"attention", attention},
                   {"layers", L},
                   {"step_s", r.step_s},
                   {"peak_activation_bytes", r.activations},
                   {"peak_bytes", r.peak},
                   {"activations_vs_context1", reference_act > 0 ? r.activations / reference_act : 0.0},
                   {"attention_bytes", counted},
                   {"attention_bytes_predicted", predicted},
                   {"attention_bytes_ratio", predicted > 0 ? counted / predicted : (counted == 0 ? 1.0 : 0.0)},
                   {"wire_bytes_per_rank", wire},
                   {"loss_all_reduce_bytes", bytes(threads::Op::all_reduce)}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t max_seq = 8192, layers = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--max-seq")) max_seq = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--layers")) layers = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "context: unknown option %s; use --max-seq T or --layers L\n", argv[i]);
      return 2;
    }
  }
  for (std::int64_t T = 1024; T <= max_seq; T *= 2) {
    const llama::Config cfg{.vocab = 256,
                            .seq = T,
                            .layers = layers,
                            .heads = 4,
                            .kv_heads = 2,
                            .width = 64,
                            .hidden = 128,
                            .rope = {.theta = 500000},
                            .norm_eps = 1e-5,
                            .seed = 1,
                            .init_std = 0.02};
    if (T <= 4096) report("none", cfg, 1, run<context::None>(cfg, 1), 0);
    const Result ring1 = run<context::Ring>(cfg, 1);
    const double a1 = static_cast<double>(ring1.activations);
    report("ring", cfg, 1, ring1, a1);
    for (int c : {2, 4}) {
      report("ring", cfg, c, run<context::Ring>(cfg, c), a1);
      report("all-gather", cfg, c, run<context::AllGather>(cfg, c), a1);
    }
  }
  return 0;
}
