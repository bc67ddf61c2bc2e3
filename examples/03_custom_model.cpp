// Trains the decoder of 03_custom_model.hpp (RMSNorm, a ReLU-squared MLP, an untied head: a model
// weft does not ship) on 4 thread ranks, data 2 x tensor 2 with sequence parallelism under ZeRO-1,
// and prints each step's loss: custom_model [--steps N] (tests/examples/custom_model.cpp checks it).
#include "03_custom_model.hpp"

#include <cstdio>

#include "cli.hpp"

using namespace weft;

int main(int argc, char** argv) {
  CLI::App app{"custom_model: a decoder weft does not ship, trained on thread ranks"};
  int steps = 20;
  app.add_option("--steps", steps, "optimizer steps")->check(examples::at_least(1))->check(examples::at_most(10000));
  if (const auto stop = examples::parse(app, argc, argv)) return *stop;
  const gpt2::Config c{.vocab = 48, .seq = 16, .layers = 2, .heads = 4, .width = 32, .seed = 7, .init_std = 0.1};
  const data::MarkovSource corpus(c.vocab, 3);  // a Markov chain: its entropy is what the loss can reach
  run_threads(4, [&](ThreadComm& world) {
    Host host;
    Mesh mesh{world, {.data = 2, .tensor = 2}};
    custom::Model<float, true> model(host, c, mesh.spread(), 8);
    auto dp = optim::data_parallel<optim::Zero1>(model, optim::AdamW{.config = {.lr = 3e-3}}, mesh);
    data::Loader<data::MarkovSource> loader(corpus, c.seq, 8, 2, mesh.coord().data);
    std::vector<std::int32_t> x, y;
    for (int step = 1; step <= steps; ++step) {
      dp.zero_grad();
      loader.next(x, y);
      auto ctx = model.in_flight({{x, y}, 8});
      const double loss = pipeline::forward_backward(model, ctx, mesh, dp, true);
      const double norm = dp.step(3e-3, 1.0);
      if (world.rank() == 0) std::printf("step %3d  loss %.4f  grad norm %.3f\n", step, loss, norm);
    }
  });
  std::printf("the corpus's entropy rate (the floor of the loss) %.4f nats\n", corpus.entropy_rate());
  return 0;
}
