// The bubble of each pipeline schedule, measured on thread ranks against its closed form: p = 2, 4
// and m = 4, 8, 16, for GPipe, 1F1B, interleaved 1F1B (V = 2) and ZB-H1.
//
// The executor, its messages and its tables are the real ones (pipeline::Pipeline over ThreadComm);
// the model is a stand-in whose stages sleep for their cost (a forward `unit` ms per block, a
// backward 2 units, or B and W 1 unit each for ZB-H1), so that p ranks on a machine with fewer
// cores still run side by side and the measurement is the schedule's, not the processor's. Each
// virtual stage holds one block. The measured bubble of a rank is 1 - (its compute time, from the
// trace) / (the step's wall time); the line reports the mean over ranks and the closed form. One
// JSON object per line.
//
//   pipeline [--unit-ms U] [--repeats R]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/pipeline/pipelined.hpp"

using namespace weft;
using namespace weft::pipeline;

namespace {

// A model whose stages sleep for their cost and pass a small activation along.
struct SleepModel {
  struct Config {
    std::int64_t layers, seq, width;
  };
  using value_type = float;
  using device = Host;
  using A = nn::act::Full;
  using MicroBatch = nn::MicroBatch;
  struct Ctx {
    Tensor<float, A, Host> x;
    double loss = 0;
    std::int64_t batch = 1;
  };

  Config config;
  double unit_ms;
  bool deferred = false;
  Host* host;
  std::vector<int> unit_list;  // no parameters

  static constexpr bool tied = false;
  std::int64_t layers() const { return config.layers; }
  Shape stream_shape(std::int64_t batch) const { return {batch, config.seq, config.width}; }
  std::span<int> units() { return unit_list; }
  std::vector<std::size_t> units_of(std::size_t) const { return {}; }
  Host& dev() const { return *host; }
  void defer_weight(bool on) { deferred = on; }
  Ctx in_flight(const nn::MicroBatch& mb) const { return Ctx{{}, 0, mb.batch}; }

  void sleep(double units) const {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(units * unit_ms));
  }
  bool block(std::size_t fs) const { return fs >= 1 && fs <= static_cast<std::size_t>(config.layers); }

  template <class M>
  void forward(std::size_t fs, Ctx& c, M& mesh, nn::Mode = nn::Mode::train) {
    if (fs == 0) c.x = Tensor<float, A, Host>::zeros(*host, {c.batch, config.seq, config.width}, mesh.spread());
    if (block(fs)) sleep(1);
    if (fs == static_cast<std::size_t>(config.layers) + 1) {
      c.loss = 1.0;
      c.x = {};
    }
  }
  template <class M>
  void backward(std::size_t fs, Ctx& c, M& mesh) {
    if (fs == static_cast<std::size_t>(config.layers) + 1)
      c.x = Tensor<float, A, Host>::zeros(*host, {c.batch, config.seq, config.width}, mesh.spread());
    if (block(fs)) sleep(deferred ? 1 : 2);
    if (fs == 0) c.x = {};
  }
  void backward_weight(std::size_t fs, Ctx&) {
    if (block(fs)) sleep(1);
  }
};

}  // namespace

int main(int argc, char** argv) {
  double unit_ms = 2.0;
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--unit-ms") && i + 1 < argc) unit_ms = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "pipeline: unknown argument %s; use --unit-ms U, --repeats R\n", argv[i]);
      return 2;
    }
  }
  const std::vector<std::int32_t> tokens(4, 0);
  for (Kind kind : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved, Kind::zero_bubble_h1})
    for (int p : {2, 4})
      for (int m : {4, 8, 16}) {
        const int v = kind == Kind::interleaved ? 2 : 1;
        const Table t = make_table(kind, p, m, v);
        double best_step = 1e300, bubble = 0;
        for (int rep = 0; rep < repeats; ++rep) {
          Trace trace(p);
          std::vector<double> step_us(static_cast<std::size_t>(p));
          run_threads(p, [&](ThreadComm& world) {
            Host h;
            Mesh mesh{world, {.pipe = p}};
            SleepModel model{{p * v, 4, 8}, unit_ms, false, &h, {}};
            const Partition part = Partition::even(p, v, model.config.layers);
            Pipeline<SleepModel, decltype(mesh)> pp(model, t, part, mesh);
            pp.set_trace(&trace, world.rank());
            std::vector<nn::MicroBatch> mbs(static_cast<std::size_t>(m), nn::MicroBatch{{tokens, tokens}, 1, 1.0 / m});
            LocalGradients none;
            world.barrier();
            const double t0 = trace.now_us();
            pp.run(mbs, none);
            step_us[static_cast<std::size_t>(world.rank())] = trace.now_us() - t0;
          });
          double step = 0, idle = 0;
          for (double s : step_us) step = std::max(step, s);
          for (int r = 0; r < p; ++r) {
            double busy = 0;
            for (const TraceEvent& e : trace.lane(r))
              if (e.category == "compute") busy += e.duration_us;
            idle += 1.0 - busy / step;
          }
          if (step < best_step) {  // the least disturbed repeat
            best_step = step;
            bubble = idle / p;
          }
        }
        const double closed = closed_form_bubble(kind, p, m, v);
        nlohmann::json j{{"bench", "pipeline"},
                         {"schedule", kind == Kind::gpipe         ? "gpipe"
                                      : kind == Kind::one_f_one_b ? "1f1b"
                                      : kind == Kind::interleaved ? "interleaved"
                                                                  : "zb"},
                         {"p", p},
                         {"m", m},
                         {"v", v},
                         {"unit_ms", unit_ms},
                         {"step_ms", best_step / 1e3},
                         {"bubble_measured", bubble},
                         {"bubble_closed_form", closed},
                         {"measured_minus_closed", bubble - closed}};
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
  return 0;
}
