// The Gpt against an independent implementation: tools/reference/gpt_reference.py computes the loss,
// logits and every parameter gradient of a tiny GPT (2 layers, width 32, 4 heads, vocabulary 64,
// sequence 16, batch 2) with PyTorch in float64, for weights given by a closed form that both sides
// evaluate. Tolerance 1e-12 relative (to the largest element of each tensor): both sides compute in
// double, and differ only in summation order and in libm's exp/tanh (each ~1e-16 relative, grown by
// a few hundred operations in sequence).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

#include "support/gpt_step.hpp"
#include "support/gradcheck.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/gpt2/model.hpp"

using namespace weft;

namespace {

constexpr std::int64_t kV = 64, kT = 16, kB = 2;

std::map<std::string, std::vector<double>> read_reference() {
  const std::string path = std::string(WEFT_TEST_DATA_DIR) + "/gpt_reference.bin";
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open ", path);
  std::map<std::string, std::vector<double>> out;
  std::string line;
  while (std::getline(f, line)) {
    const auto space = line.find(' ');
    REQUIRE(space != std::string::npos);
    const std::size_t n = std::stoul(line.substr(space + 1));
    std::vector<double> v(n);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(double)));
    REQUIRE_MESSAGE(f.gcount() == static_cast<std::streamsize>(n * sizeof(double)), "truncated record ", line);
    out[line.substr(0, space)] = std::move(v);
  }
  return out;
}

// The closed form of gpt_reference.py's weight().
double weight(int index, bool one, std::int64_t i) {
  const double s = 0.15 * std::sin(0.731 * static_cast<double>(i) + 1.37 * index + 0.5) *
                   std::cos(0.117 * static_cast<double>(i) + 0.29 * index);
  return one ? 1.0 + s : s;
}

struct TorchRun {
  double loss = 0;
  std::vector<double> logits;
  std::map<std::string, std::vector<double>> grads;
};

template <bool SP>
TorchRun torch_run(int tp) {
  TorchRun out;
  std::mutex mu;
  std::vector<std::vector<double>> shards(static_cast<std::size_t>(tp));  // each rank's logits (B, T, Vp/tp)
  std::vector<std::int32_t> x(kB * kT), y(kB * kT);
  for (std::int64_t i = 0; i < kB * kT; ++i) {
    x[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((7 * i + 3 * (i / kT) + 1) % kV);
    y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((5 * i + 11 * (i / kT) + 2) % kV);
  }
  run_threads(tp, [&](ThreadComm& world) {
    Mesh mesh{world, {.tensor = tp}};
    Host h;
    gpt2::Model<double, SP> gpt(h, {.vocab = kV, .seq = kT, .layers = 2, .heads = 4, .width = 32}, mesh.spread(), kB);
    int index = 0;
    gpt.for_each_param([&](const std::string& name, auto& p) {
      const bool one = name.find("ln") != std::string::npos && name.ends_with(".weight");
      for (std::int64_t i = 0; i < p.value.numel(); ++i) p.value[i] = weight(index, one, p.value.global_index(i));
      ++index;
    });
    std::vector<double> logits;
    const double loss = test::forward_backward(gpt, x, y, kB, mesh, &logits);
    shards[static_cast<std::size_t>(world.rank())] = logits;
    std::map<std::string, std::vector<double>> grads;
    gpt.for_each_param([&](const std::string& name, auto& p) {
      const auto g = redistribute<Replicated>(p.grad, mesh);
      grads[name].assign(g.data(), g.data() + g.numel());
    });
    if (world.rank() != 0) return;
    std::lock_guard lock(mu);
    out = {loss, {}, grads};
  });
  // The whole logits (B, T, V): each row the ranks' vocabulary shards side by side, the padding cut.
  const auto cols = static_cast<std::int64_t>(shards[0].size()) / (kB * kT);
  for (std::int64_t row = 0; row < kB * kT; ++row)
    for (std::int64_t v = 0; v < kV; ++v)
      out.logits.push_back(shards[static_cast<std::size_t>(v / cols)][static_cast<std::size_t>(row * cols + v % cols)]);
  return out;
}

}  // namespace

TEST_CASE("Gpt matches PyTorch: loss logits and every gradient within 1e-12") {
  const auto ref = read_reference();
  REQUIRE(ref.at("loss").size() == 1);
  const TorchRun r = torch_run<false>(1);
  CHECK(std::fabs(r.loss - ref.at("loss")[0]) <= 1e-12 * ref.at("loss")[0]);
  CHECK(test::rel_error(r.logits, ref.at("logits")) <= 1e-12);
  double worst = 0;
  for (const auto& [name, g] : r.grads) {
    const double e = test::rel_error(g, ref.at(name));
    CHECK_MESSAGE(e <= 1e-12, name, " off by ", e);
    worst = test::worse(worst, e);
  }
  CHECK(r.grads.size() == 28);
  MESSAGE("loss ", r.loss, " (PyTorch ", ref.at("loss")[0], "), worst gradient relative error ", worst);
}

TEST_CASE("Gpt matches PyTorch under tensor parallelism and sequence parallelism") {
  const auto ref = read_reference();
  for (int tp : {2, 4}) {
    for (const TorchRun& r : {torch_run<false>(tp), torch_run<true>(tp)}) {
      CHECK(std::fabs(r.loss - ref.at("loss")[0]) <= 1e-12 * ref.at("loss")[0]);
      CHECK(test::rel_error(r.logits, ref.at("logits")) <= 1e-12);
      CHECK(r.grads.size() == 28);  // every parameter's gradient, gathered whole, none missing
      for (const auto& [name, g] : r.grads)
        CHECK_MESSAGE(test::rel_error(g, ref.at(name)) <= 1e-12, name, " at tp ", tp);
    }
  }
}
