// Pipeline parallelism equals one rank: the loss and every global gradient of one step (4
// micro-batches), and 5 AdamW steps, under every schedule at pipe 2 and 4, alone and with tensor 2
// and data 2 (8 thread ranks), within 1e-12 relative in double and 1e-5 in float.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include "support/gradcheck.hpp"
#include "support/ranks.hpp"
#include "support/train_steps.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/data/loader.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/pipelined.hpp"

using namespace weft;
using namespace weft::pipeline;

namespace {

// 8 layers split over p x V virtual stages; vocabulary 33 (padded under tensor 2).
const gpt2::Config kPipeConfig{.vocab = 33, .seq = 8, .layers = 8, .heads = 2, .width = 16, .seed = 3, .init_std = 0.1};
constexpr std::int64_t kMicro = 4;  // global micro-batch (sequences)
constexpr int kM = 4;               // micro-batches per step

using Run = test::StepsRun;

// `steps` steps of AdamW with clipping at 1 over kM micro-batches each (support/train_steps.hpp);
// pipe 1 runs the same micro-batches one after another through the plain executor (the reference).
template <class Sched, class T, class Strategy = optim::Ddp, bool SP = false>
Run run(int pipe, int v, int tensor, int data, int steps) {
  return test::train_steps<gpt2::Model<T, SP>, Sched, Strategy>(kPipeConfig, kMicro, kM, pipe, v, tensor, data, steps);
}

double worst(const std::map<std::string, std::vector<double>>& a, const std::map<std::string, std::vector<double>>& ref,
             std::string& where) {
  return test::worst_tensor(a, ref, where);
}

template <class Sched, class T>
void compare(int pipe, int v, double tol) {
  const Run ref = run<Sched, T>(1, 1, 1, 1, 1);
  const Run got = run<Sched, T>(pipe, v, 1, 1, 1);
  std::string where;
  CHECK_MESSAGE(std::abs(got.losses[0] - ref.losses[0]) <= tol * std::abs(ref.losses[0]), std::string(Sched::name),
                " pipe ", pipe);
  const double e = worst(got.grads, ref.grads, where);
  CHECK_MESSAGE(e <= tol, std::string(Sched::name), " pipe ", pipe, " V ", v, ": gradient of ", where, " off by ", e);
  MESSAGE(std::string(Sched::name), " pipe ", pipe, " V ", v, ": worst gradient error ", e, " (", where, ")");
}

// The kM micro-batches of one step, read from `corpus` in order (each 1/kM of the step's gradient);
// x and y own the tokens the micro-batches view.
std::vector<nn::MicroBatch> micro_batches(const data::MarkovSource& corpus, std::vector<std::vector<std::int32_t>>& x,
                                          std::vector<std::vector<std::int32_t>>& y) {
  data::Loader<data::MarkovSource> loader(corpus, kPipeConfig.seq, kMicro, 1, 0);
  x.assign(kM, {});
  y.assign(kM, {});
  std::vector<nn::MicroBatch> mbs;
  for (std::size_t i = 0; i < static_cast<std::size_t>(kM); ++i) {
    loader.next(x[i], y[i]);
    mbs.push_back({{x[i], y[i]}, kMicro, 1.0 / kM});
  }
  return mbs;
}

}  // namespace

TEST_CASE_TEMPLATE("every schedule at pipe 2 and 4: loss and every gradient equal one rank within 1e-12 in double", S,
                   GPipe, OneFOneB, ZeroBubbleH1) {
  // (Gradients are compared per tensor: max |difference| over max |reference| of each.)
  compare<S, double>(2, 1, 1e-12);
  compare<S, double>(4, 1, 1e-12);
}

TEST_CASE("interleaved 1F1B (V = 2) at pipe 2 and 4: loss and every gradient equal one rank within 1e-12 in double") {
  compare<Interleaved, double>(2, 2, 1e-12);
  compare<Interleaved, double>(4, 2, 1e-12);
}

TEST_CASE("1F1B and ZB-H1 at pipe 2 in float: within 1e-5") {
  compare<OneFOneB, float>(2, 1, 1e-5);
  compare<ZeroBubbleH1, float>(2, 1, 1e-5);
}

TEST_CASE(
    "5 AdamW steps on pipe 2 x tensor 2 x data 2 (8 ranks) equal one rank within 1e-12, for every data strategy") {
  const Run ref = run<OneFOneB, double>(1, 1, 1, 1, 5);
  auto check = [&]<class Sched, class Strategy, bool SP>() {
    const Run got = run<Sched, double, Strategy, SP>(2, 1, 2, 2, 5);
    for (std::size_t i = 0; i < ref.losses.size(); ++i)
      CHECK_MESSAGE(std::abs(got.losses[i] - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]),
                    std::string(Sched::name), " ", Strategy::name(), " step ", i);
    // The global parameter vector: max |difference| over max |parameter| (per tensor, the attention's
    // key biases, whose exact gradient is zero, stand out at ~1e-11: their values are rounding noise
    // that Adam's normalization turns into updates; tests/optim/optimizer.cpp measures the same way).
    REQUIRE(got.values.size() == ref.values.size());
    double diff = 0, scale = 0;
    for (const auto& [name, v] : ref.values)
      for (std::size_t i = 0; i < v.size(); ++i) {
        diff = test::worse(diff, std::fabs(got.values.at(name).at(i) - v[i]));
        scale = std::max(scale, std::fabs(v[i]));
      }
    const double e = diff / scale;
    CHECK_MESSAGE(e <= 1e-12, std::string(Sched::name), " ", Strategy::name(), " SP ", SP, ": off by ", e);
    MESSAGE(std::string(Sched::name), " ", Strategy::name(), " SP ", SP, ": worst parameter error after 5 steps ", e);
  };
  check.template operator()<OneFOneB, optim::Ddp, false>();
  check.template operator()<ZeroBubbleH1, optim::Zero1, true>();
  check.template operator()<GPipe, optim::Zero2, false>();
  check.template operator()<OneFOneB, optim::Fsdp, true>();
  // ZB-H1's weight passes re-acquire a gradient buffer an earlier one reduced and freed.
  check.template operator()<ZeroBubbleH1, optim::Fsdp, false>();
}

TEST_CASE("recompute policies compose with the schedules: ZB-H1 with Full and 1F1B with Selective equal one rank") {
  auto one = [&]<class Sched, class R>(int pipe) {
    std::map<std::string, std::vector<double>> out;
    std::mutex mu;
    const data::MarkovSource corpus(kPipeConfig.vocab, 5);
    run_threads(pipe, [&](ThreadComm& world) {
      Host h;
      Mesh mesh{world, {.pipe = pipe}};
      const Partition part = Partition::even(pipe, 1, kPipeConfig.layers);
      using Model = gpt2::Model<double, false, R>;
      Model gpt(h, kPipeConfig, mesh.spread(), kMicro, part.placement(mesh.coord().pipe));
      auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
      std::vector<std::vector<std::int32_t>> x, y;
      const std::vector<nn::MicroBatch> mbs = micro_batches(corpus, x, y);
      if (pipe > 1) {
        Pipeline<Model, decltype(mesh)> pp(gpt, table<Sched>(pipe, kM), part, mesh);
        pp.run(mbs, dp);
      } else {
        for (int i = 0; i < kM; ++i) {
          auto ctx = gpt.in_flight(mbs[static_cast<std::size_t>(i)]);
          pipeline::forward_backward(gpt, ctx, mesh, dp, i + 1 == kM);
        }
      }
      gpt.for_each_param([&](const std::string& name, auto& p) {
        std::lock_guard lock(mu);
        out[name].assign(p.grad.data(),
                         p.grad.data() + (name == "wte" ? kPipeConfig.vocab * kPipeConfig.width : p.grad.numel()));
      });
    });
    return out;
  };
  const auto ref = one.template operator()<OneFOneB, recompute::None>(1);
  std::string where;
  const double full = worst(one.template operator()<ZeroBubbleH1, recompute::Full>(2), ref, where);
  CHECK_MESSAGE(full <= 1e-12, "ZB-H1 with Full recompute: ", where, " off by ", full);
  const double sel = worst(one.template operator()<OneFOneB, recompute::Selective>(2), ref, where);
  CHECK_MESSAGE(sel <= 1e-12, "1F1B with Selective recompute: ", where, " off by ", sel);
}

TEST_CASE("a rank that fails mid-schedule makes every rank raise within the deadline, never a hang") {
  // Rank 1 (the last stage) is given a micro-batch with a token outside the vocabulary for its
  // third micro-batch: it raises there; rank 0, waiting for a gradient, raises within the deadline.
  // The clock starts when rank 1 raises (building the model and the first micro-batches, slow under
  // the sanitizers, are not what the deadline bounds).
  std::atomic<std::int64_t> failed_at{0};  // steady_clock ticks of rank 1's raise
  std::string message;
  try {
    threads::Options opts;
    opts.deadline = std::chrono::milliseconds(2000);
    run_threads(
        2,
        [&](ThreadComm& world) {
          Host h;
          Mesh mesh{world, {.pipe = 2}};
          const Partition part = Partition::even(2, 1, kPipeConfig.layers);
          gpt2::Model<double> gpt(h, kPipeConfig, mesh.spread(), kMicro, part.placement(mesh.coord().pipe));
          auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
          Pipeline<gpt2::Model<double>, decltype(mesh)> pp(gpt, table<OneFOneB>(2, kM), part, mesh);
          std::vector<std::vector<std::int32_t>> x(
              kM, std::vector<std::int32_t>(static_cast<std::size_t>(kMicro * kPipeConfig.seq), 1));
          if (world.rank() == 1) x[2][0] = 999;
          std::vector<nn::MicroBatch> mbs;
          for (int i = 0; i < kM; ++i)
            mbs.push_back({{x[static_cast<std::size_t>(i)], x[static_cast<std::size_t>(i)]}, kMicro, 1.0 / kM});
          try {
            pp.run(mbs, dp);
          } catch (...) {
            if (world.rank() == 1) failed_at = std::chrono::steady_clock::now().time_since_epoch().count();
            throw;
          }
        },
        opts);
  } catch (const Error& e) { message = e.what(); }
  const auto end = std::chrono::steady_clock::now();
  CHECK_MESSAGE(message.find("world rank 1 failed") != std::string::npos, message);
  CHECK_MESSAGE(message.find("token 999") != std::string::npos, message);
  REQUIRE(failed_at.load() != 0);
  const double waited = std::chrono::duration<double>(end - std::chrono::steady_clock::time_point(
                                                                std::chrono::steady_clock::duration(failed_at.load())))
                            .count();
  CHECK(waited < 2.0 + test::kSchedulingMargin);  // within the deadline, and the margin for a loaded machine
  MESSAGE("every rank raised ", waited, " s after rank 1 did (deadline 2 s)");
}

namespace {

// The executor's stop hook (pipeline::StopHook) that stops the step at its point `at` (-1: never),
// counting the points it is called at.
struct StopAt {
  int at = -1, seen = 0;
  void point() {
    if (seen++ == at) throw StepStopped{};
  }
};

// One step of GPT-2 in double on pipe p (thread ranks) under schedule Sched: first the step stopped
// at cut `stop` of the table (-1: not stopped), then the same step whole. Returns the points each
// rank's hook saw in the stopped (or first) run, whether every rank stopped, and the whole step's
// loss and gradients.
struct Stopped {
  std::vector<int> points;
  bool all_stopped = true;
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
};

template <class Sched>
Stopped stop_then_run(int pipe, int v, int stop) {
  Stopped out;
  out.points.assign(static_cast<std::size_t>(pipe), 0);
  std::mutex mu;
  const data::MarkovSource corpus(kPipeConfig.vocab, 5);
  run_threads(pipe, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {.pipe = pipe}};
    const Partition part = Partition::even(pipe, v, kPipeConfig.layers);
    using Model = gpt2::Model<double>;
    Model gpt(h, kPipeConfig, mesh.spread(), kMicro, part.placement(mesh.coord().pipe));
    auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
    std::vector<std::vector<std::int32_t>> x, y;
    const std::vector<nn::MicroBatch> mbs = micro_batches(corpus, x, y);
    Pipeline<Model, decltype(mesh)> pp(gpt, table<Sched>(pipe, kM, v), part, mesh);
    StopAt hook{stop};
    bool stopped = false;
    try {
      pp.run(mbs, dp, hook);
    } catch (const StepStopped&) { stopped = true; }
    dp.zero_grad();
    const double loss = pp.run(mbs, dp);  // the whole step, on the communicator the stop left
    std::lock_guard lock(mu);
    out.points[static_cast<std::size_t>(world.rank())] = hook.seen;
    out.all_stopped = out.all_stopped && stopped;
    out.loss = loss;
    gpt.for_each_param([&](const std::string& name, auto& p) {
      out.grads[name].assign(p.grad.data(),
                             p.grad.data() + (name == "wte" ? kPipeConfig.vocab * kPipeConfig.width : p.grad.numel()));
    });
  });
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE(
    "a pipelined step stopped at any cut of its table stops every rank there and leaves no message behind", S, GPipe,
    OneFOneB, ZeroBubbleH1, Interleaved) {
  // Every cut of the table (pipeline::cuts) on pipe 2 (V = 2 for interleaved) and, for 1F1B, pipe
  // 4: every rank's hook is called at the same number of points, every rank stops at the one
  // given, none hangs (the messages sent across the cut are received: the communicator's
  // deadline would raise otherwise), and the step then run whole on the same communicators gives,
  // bit for bit, the loss and gradients of a step never stopped (a message left in flight would be
  // received in the next step's place, or refused).
  const int v = std::same_as<S, Interleaved> ? 2 : 1;
  for (int pipe : std::same_as<S, OneFOneB> ? std::vector<int>{2, 4} : std::vector<int>{2}) {
    const Stopped whole = stop_then_run<S>(pipe, v, -1);
    const int n = whole.points[0];
    for (int r = 0; r < pipe; ++r)
      CHECK_MESSAGE(whole.points[static_cast<std::size_t>(r)] == n, std::string(S::name), " rank ", r);
    REQUIRE(n == cuts(table<S>(pipe, kM, v)).count());
    REQUIRE(n >= kM);  // a cut at least every micro-batch, so a long step stops part-way
    for (int c = 0; c < n; ++c) {
      const Stopped got = stop_then_run<S>(pipe, v, c);
      CAPTURE(c);
      CHECK_MESSAGE(got.all_stopped, std::string(S::name), " pipe ", pipe);
      CHECK(got.loss == whole.loss);
      std::string where;
      CHECK_MESSAGE(worst(got.grads, whole.grads, where) == 0, std::string(S::name), " pipe ", pipe, ": ", where);
    }
    MESSAGE(std::string(S::name), " pipe ", pipe, " V ", v, ": stopped at each of its ", n, " cuts");
  }
}

TEST_CASE("partitions refuse what cannot be split, naming the values") {
  CHECK_THROWS_WITH_AS(Partition::even(3, 1, 8),
                       doctest::Contains("8 layers do not split evenly over pipe 3 x 1 virtual stages = 3"), Error);
  CHECK_THROWS_WITH_AS(Partition::given(2, 1, {8}), doctest::Contains("1 stage sizes for pipe 2 x 1 virtual stages"),
                       Error);
  CHECK_THROWS_WITH_AS(Partition::given(3, 1, {4, 0, 4}), doctest::Contains("virtual stage 1 of 3 is given 0 blocks"),
                       Error);
  const Partition p = Partition::given(2, 1, {0, 8});  // the first stage holds the embedding alone
  CHECK(p.fine(0) == std::vector<std::size_t>{0});
  CHECK(p.fine(1).size() == 9);  // 8 blocks and the head
  CHECK(p.placement(0).embedding);
  CHECK(!p.placement(0).head);
}
