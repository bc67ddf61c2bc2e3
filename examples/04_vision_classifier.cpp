// Trains the vision transformer of 04_vision_classifier.hpp on synthetic images for 30 steps on each of
// four layouts of thread ranks and prints the losses (tests/examples/vision_classifier.cpp holds every
// layout, pipelines among them, to one rank in double).
#include "04_vision_classifier.hpp"

#include <cstdio>

using namespace weft;

template <bool SP, class Cx>
void train_on(const char* layout, MeshShape shape) {
  std::vector<double> losses;
  run_threads(shape.data * shape.pipe * shape.context * shape.tensor, [&](ThreadComm& world) {
    Host host;
    Mesh mesh{world, shape};
    const vit::Config c;
    vit::Model<SP, Cx> model(host, c, mesh.spread(), 16);  // micro-batches of 16
    auto dp = optim::data_parallel<optim::Zero1>(model, optim::AdamW{}, mesh);
    vit::Data data{c, 16, shape.data, mesh.coord().data, 2};  // 2 micro-batches a step
    for (int step = 0; step < 30; ++step) {
      dp.zero_grad();
      double loss = 0;
      for (int i = 0; i < 2; ++i) {
        auto ctx = model.in_flight(data.next(step, i, 0.5));
        loss += pipeline::forward_backward(model, ctx, mesh, dp, i == 1) / 2;
      }
      dp.step(3e-3, 1.0);
      if (world.rank() == 0) losses.push_back(loss);
    }
  });
  std::printf("%-44s loss %.4f at step 1, %.4f at step 30\n", layout, losses.front(), losses.back());
}

int main() {
  train_on<false, context::None>("one rank", {});
  train_on<true, context::None>("data 2 x tensor 2, sequence parallelism", {.data = 2, .tensor = 2});
  train_on<false, context::Ring>("context 2 x tensor 2 (ring attention)", {.context = 2, .tensor = 2});
  train_on<true, context::Ring>("data 2 x context 2 x tensor 2, SP", {.data = 2, .context = 2, .tensor = 2});
}
