// The trace of a pipelined step: a small 1F1B run on 2 pipe ranks writes a Chrome trace whose
// events, parsed back, follow each rank's table: its computes in the table's order, none
// overlapping, and the receive waits of the messages it receives.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/data/loader.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/pipelined.hpp"

using namespace weft;
using namespace weft::pipeline;

TEST_CASE("a 1F1B step's trace follows each rank's table") {
  const gpt2::Config cfg{.vocab = 16, .seq = 8, .layers = 2, .heads = 2, .width = 16, .seed = 1};
  constexpr int p = 2, m = 4;
  const Table t = table<OneFOneB>(p, m);
  Trace trace(p);
  const data::MarkovSource corpus(cfg.vocab, 2);
  run_threads(p, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {.pipe = p}};
    const Partition part = Partition::even(p, 1, cfg.layers);
    gpt2::Model<double> gpt(h, cfg, mesh.spread(), 2, part.placement(mesh.coord().pipe));
    auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
    Pipeline<gpt2::Model<double>, decltype(mesh)> pp(gpt, t, part, mesh);
    pp.set_trace(&trace, mesh.coord().pipe);
    data::Loader<data::MarkovSource> loader(corpus, cfg.seq, 2, 1, 0);
    std::vector<std::vector<std::int32_t>> x(m), y(m);
    std::vector<nn::MicroBatch> mbs;
    for (int i = 0; i < m; ++i) {
      loader.next(x[static_cast<std::size_t>(i)], y[static_cast<std::size_t>(i)]);
      mbs.push_back({{x[static_cast<std::size_t>(i)], y[static_cast<std::size_t>(i)]}, 2, 1.0 / m});
    }
    pp.run(mbs, dp);
  });
  const std::string path = "pipeline_trace_test.json";
  trace.write(path);
  std::ifstream f(path);
  const auto doc = nlohmann::json::parse(f);
  std::remove(path.c_str());
  for (int r = 0; r < p; ++r) {
    std::vector<nlohmann::json> computes;
    int waits = 0;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] != "X" || e["tid"] != r) continue;
      if (e["cat"] == "compute") computes.push_back(e);
      if (e["name"] == "recv wait") ++waits;
    }
    std::sort(computes.begin(), computes.end(), [](const auto& a, const auto& b) { return a["ts"] < b["ts"]; });
    std::vector<Action> expect;
    for (const Action& a : t.ranks[static_cast<std::size_t>(r)])
      if (a.what != Do::exchange) expect.push_back(a);
    REQUIRE(computes.size() == expect.size());
    for (std::size_t i = 0; i < expect.size(); ++i) {
      CHECK(computes[i]["name"] == name(expect[i].what));
      CHECK(computes[i]["args"]["stage"] == expect[i].stage);
      CHECK(computes[i]["args"]["micro"] == expect[i].micro);
      if (i > 0)  // one track: the previous compute ended before this one began
        CHECK(computes[i - 1]["ts"].get<double>() + computes[i - 1]["dur"].get<double>() <=
              computes[i]["ts"].get<double>() + 1e-3);
    }
    // Rank 1 receives m activations, rank 0 m gradients: a receive wait each.
    CHECK(waits == m);
  }
}
