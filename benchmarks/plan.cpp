// The plan against a run, on thread ranks (data x tensor), for every data-parallel strategy with and
// without sequence parallelism: the step time the time model predicts (weft/models/gpt2/estimate.hpp, with
// rates measured on this host in the same run: weft/cost/host_rates.hpp) against the measured
// step time (the median of --steps steps, after one warm-up), and the step's planned peak bytes
// (weft/models/gpt2/replay.hpp) against the allocator's. One JSON object per line; the target is a time
// within 25% and memory within 5% (the memory plan is exact: tests/models/gpt2/replay.cpp).
//
// With --pipe P > 1: pipelines instead (data x pipe x tensor thread ranks, --micro-batches M of the
// batch each), for every schedule (interleaved with 2 virtual stages where the layers and M allow)
// under DDP and FSDP: estimate::pipeline_seconds and footprint::pipeline_step (the largest pipe
// rank's peak) against the measured step.
//
//   plan [--layers L] [--width C] [--heads H] [--seq T] [--vocab V] [--batch B] [--data D] [--tensor N] [--steps S]
//        [--pipe P] [--micro-batches M]
#include <weft/weft_host.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <weft/cost/host_rates.hpp>
#include <weft/cost/time.hpp>
#include <weft/models/gpt2/estimate.hpp>
#include <weft/models/gpt2/model.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/pipelined.hpp>

using namespace weft;
using Clock = std::chrono::steady_clock;

namespace {

struct Run {
  double step_s = 0;
  std::int64_t peak = 0;
};

// step() once to warm up, then `steps` times between barriers: this rank's times and peak bytes.
template <class Step>
void time_steps(ThreadComm& world, Host& host, Step&& step, std::int64_t steps, std::vector<double>& times,
                std::int64_t& peak) {
  step();
  for (std::int64_t s = 0; s < steps; ++s) {
    world.barrier();
    host.reset_peak();
    const auto t0 = Clock::now();
    step();
    world.barrier();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  peak = host.memory().total_peak;
}

// Rank 0's median step and the largest rank's peak.
Run median(std::vector<std::vector<double>> times, const std::vector<std::int64_t>& peaks) {
  std::vector<double>& t = times[0];
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], *std::max_element(peaks.begin(), peaks.end())};
}

template <class Strategy, bool SP>
Run measure(const gpt2::Config& cfg, MeshShape shape, std::int64_t batch, std::int64_t steps) {
  const int ranks = shape.data * shape.tensor;
  std::vector<std::vector<double>> times(static_cast<std::size_t>(ranks));
  std::vector<std::int64_t> peaks(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](ThreadComm& world) {
    Mesh mesh{world, shape};
    Host host;
    gpt2::Model<float, SP> gpt(host, cfg, mesh.spread(), batch);
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{}, mesh);
    const std::size_t n = static_cast<std::size_t>(batch / shape.data * cfg.seq);
    std::vector<std::int32_t> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = static_cast<std::int32_t>(weft::philox(1, 1, i)[0] % static_cast<std::uint64_t>(cfg.vocab));
      y[i] = static_cast<std::int32_t>(weft::philox(1, 2, i)[0] % static_cast<std::uint64_t>(cfg.vocab));
    }
    const auto r = static_cast<std::size_t>(world.rank());
    time_steps(
        world, host,
        [&] {
          dp.zero_grad();
          auto ctx = gpt.in_flight({{x, y}, batch});
          pipeline::forward_backward(gpt, ctx, mesh, dp);
          dp.step(1e-4, 1.0);
        },
        steps, times[r], peaks[r]);
  });
  return median(std::move(times), peaks);
}

template <class Strategy, bool SP>
nlohmann::json compare(const char* name, const gpt2::Config& cfg, MeshShape shape, std::int64_t batch,
                       std::int64_t steps, estimate::Rates& rates, bool& measured_rates) {
  const Spread s{.data_degree = shape.data, .tensor_degree = shape.tensor};
  const estimate::Work w = estimate::work<Strategy, F32, SP>(cfg, s, batch);
  if (!measured_rates) {
    rates = estimate::host_rates<float>(w, shape, batch / shape.data, cfg.seq, cfg.heads, cfg.width);
    measured_rates = true;
  }
  const estimate::Breakdown b = estimate::seconds(w, rates);
  const Run run = measure<Strategy, SP>(cfg, shape, batch, steps);
  return {{"bench", "plan"},
          {"strategy", name},
          {"data", shape.data},
          {"tensor", shape.tensor},
          {"planned_step_s", b.total()},
          {"measured_step_s", run.step_s},
          {"time_ratio", b.total() / run.step_s},
          {"planned",
           {{"gemm_s", b.gemm},
            {"attention_s", b.attention},
            {"elementwise_s", b.elementwise},
            {"memory_s", b.memory},
            {"tensor_comm_s", b.tensor_comm},
            {"data_comm_s", b.data_comm}}},
          {"planned_peak_bytes", w.memory.total},
          {"measured_peak_bytes", run.peak},
          {"memory_ratio", static_cast<double>(w.memory.total) / static_cast<double>(run.peak)}};
}

// A pipelined step: m micro-batches of micro sequences through `table` on data x pipe x tensor
// thread ranks; the median of `steps` steps after one warm-up, and the largest rank's peak.
template <class Strategy>
Run measure_pipeline(const gpt2::Config& cfg, MeshShape shape, std::int64_t micro, const pipeline::Table& table,
                     std::int64_t steps) {
  const int ranks = shape.data * shape.pipe * shape.tensor;
  std::vector<std::vector<double>> times(static_cast<std::size_t>(ranks));
  std::vector<std::int64_t> peaks(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](ThreadComm& world) {
    Mesh mesh{world, shape};
    Host host;
    using Model = gpt2::Model<float, false>;
    const auto part = pipeline::Partition::even(shape.pipe, table.v, cfg.layers);
    Model gpt(host, cfg, mesh.spread(), micro, part.placement(mesh.coord().pipe));
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{}, mesh);
    pipeline::Pipeline<Model, decltype(mesh)> pp(gpt, table, part, mesh);
    const std::size_t n = static_cast<std::size_t>(micro / shape.data * cfg.seq);
    std::vector<std::vector<std::int32_t>> x(static_cast<std::size_t>(table.m), std::vector<std::int32_t>(n)), y(x);
    std::vector<nn::MicroBatch> mbs;
    for (std::size_t k = 0; k < x.size(); ++k) {
      for (std::size_t i = 0; i < n; ++i) {
        x[k][i] = static_cast<std::int32_t>(weft::philox(1, k, i)[0] % static_cast<std::uint64_t>(cfg.vocab));
        y[k][i] = static_cast<std::int32_t>(weft::philox(2, k, i)[0] % static_cast<std::uint64_t>(cfg.vocab));
      }
      mbs.push_back({{x[k], y[k]}, micro, 1.0 / table.m});
    }
    const auto r = static_cast<std::size_t>(world.rank());
    time_steps(
        world, host,
        [&] {
          dp.zero_grad();
          pp.run(mbs, dp);
          dp.step(1e-4, 1.0);
        },
        steps, times[r], peaks[r]);
  });
  return median(std::move(times), peaks);
}

template <class Strategy>
nlohmann::json compare_pipeline(const char* name, const gpt2::Config& cfg, MeshShape shape, std::int64_t batch, int m,
                                pipeline::Kind kind, int v, std::int64_t steps, estimate::Rates& rates,
                                bool& measured_rates) {
  const Spread s{.data_degree = shape.data, .tensor_degree = shape.tensor};
  const std::int64_t micro = batch / m;
  const pipeline::Table table = pipeline::make_table(kind, shape.pipe, m, v);
  if (!measured_rates) {  // every rank of the mesh runs at once
    const estimate::Work w = estimate::work<Strategy, F32, false>(cfg, s, micro, m);
    rates = estimate::host_rates<float>(w, {.data = shape.data * shape.pipe, .tensor = shape.tensor},
                                        micro / shape.data, cfg.seq, cfg.heads, cfg.width);
    measured_rates = true;
  }
  // Messages between pipe ranks: the thread communicator's data-group link stands in.
  const estimate::PipelineTime t =
      estimate::pipeline_seconds<Strategy, F32, false>(cfg, s, micro, table, rates, rates.data);
  std::int64_t planned_peak = 0;
  for (int r = 0; r < shape.pipe; ++r)
    planned_peak =
        std::max(planned_peak, footprint::pipeline_step<Strategy, F32, false>(cfg, s, micro, table, r).total);
  const Run run = measure_pipeline<Strategy>(cfg, shape, micro, table, steps);
  return {{"bench", "plan"},
          {"strategy", name},
          {"schedule", pipeline::Kind::gpipe == kind         ? "gpipe"
                       : pipeline::Kind::one_f_one_b == kind ? "1f1b"
                       : pipeline::Kind::interleaved == kind ? "interleaved"
                                                             : "zb"},
          {"data", shape.data},
          {"pipe", shape.pipe},
          {"virtual_stages", v},
          {"tensor", shape.tensor},
          {"micro_batches", m},
          {"planned_step_s", t.step},
          {"measured_step_s", run.step_s},
          {"time_ratio", t.step / run.step_s},
          {"planned",
           {{"makespan_s", t.makespan},
            {"block_s", t.block},
            {"ends_s", t.ends},
            {"message_s", t.message},
            {"once_s", t.once},
            {"bubble", t.bubble}}},
          {"planned_peak_bytes", planned_peak},
          {"measured_peak_bytes", run.peak},
          {"memory_ratio", static_cast<double>(planned_peak) / static_cast<double>(run.peak)}};
}

}  // namespace

int main(int argc, char** argv) {
  gpt2::Config cfg{.vocab = 512, .seq = 64, .layers = 2, .heads = 4, .width = 128};
  std::int64_t batch = 8, steps = 15;
  int micro_batches = 4;
  MeshShape shape{.data = 2, .tensor = 2};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const auto v = std::stoll(argv[i + 1]);
    if (a == "--layers") cfg.layers = v;
    else if (a == "--width") cfg.width = v;
    else if (a == "--heads") cfg.heads = v;
    else if (a == "--seq") cfg.seq = v;
    else if (a == "--vocab") cfg.vocab = v;
    else if (a == "--batch") batch = v;
    else if (a == "--data") shape.data = static_cast<int>(v);
    else if (a == "--tensor") shape.tensor = static_cast<int>(v);
    else if (a == "--steps") steps = std::max<std::int64_t>(v, 1);
    else if (a == "--pipe") shape.pipe = static_cast<int>(v);
    else if (a == "--micro-batches") micro_batches = static_cast<int>(v);
    else {
      std::fprintf(
          stderr,
          "plan: unknown option %s; use --layers --width --heads --seq --vocab --batch --data --tensor --steps "
          "--pipe --micro-batches\n",
          a.c_str());
      return 2;
    }
  }
  try {
    estimate::Rates rates;
    bool measured = false;
    auto line = [&](const nlohmann::json& j) {
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    };
    if (shape.pipe > 1) {
      using pipeline::Kind;
      for (Kind kind : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved, Kind::zero_bubble_h1}) {
        const int v = kind == Kind::interleaved ? 2 : 1;
        if (cfg.layers % (shape.pipe * v) != 0 || (kind == Kind::interleaved && micro_batches % shape.pipe != 0))
          continue;
        line(compare_pipeline<optim::Ddp>("ddp", cfg, shape, batch, micro_batches, kind, v, steps, rates, measured));
        line(compare_pipeline<optim::Fsdp>("fsdp", cfg, shape, batch, micro_batches, kind, v, steps, rates, measured));
      }
      return 0;
    }
    line(compare<optim::Ddp, false>("ddp", cfg, shape, batch, steps, rates, measured));
    line(compare<optim::Ddp, true>("ddp-sp", cfg, shape, batch, steps, rates, measured));
    line(compare<optim::Zero1, false>("zero1", cfg, shape, batch, steps, rates, measured));
    line(compare<optim::Zero1, true>("zero1-sp", cfg, shape, batch, steps, rates, measured));
    line(compare<optim::Zero2, false>("zero2", cfg, shape, batch, steps, rates, measured));
    line(compare<optim::Zero2, true>("zero2-sp", cfg, shape, batch, steps, rates, measured));
    line(compare<optim::Fsdp, false>("fsdp", cfg, shape, batch, steps, rates, measured));
    line(compare<optim::Fsdp, true>("fsdp-sp", cfg, shape, batch, steps, rates, measured));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
