// A trainer binary for the decoder of 03_custom_model.hpp, from weft's trainer library: the model's
// family (a few lines) and a main. Everything train_gpt does comes with it: thread ranks or
// mpirun, tensor, sequence, pipeline and data parallelism, gradient accumulation, clipping, the
// learning-rate schedule, evaluation, checkpoints that resume on any mesh, signals, logs, traces.
//
//   custom_model_train --steps 50 --data 2 --tensor 2 --strategy zero1-sp
//   custom_model_train --pipe 2 --schedule zb --save-dir ck && custom_model_train --resume ck/step_50 --steps 80
//   custom_model_train --help
#include "03_custom_model.hpp"

#include <weft/train/main.hpp>

namespace {

using namespace weft;

struct CustomFamily {
  template <class P, bool SP, class D>
  using model = custom::Model<P, SP, D>;
  // What this binary compiles (each a loop instantiation; fewer build faster): DDP and ZeRO-1, with
  // and without SP, in f32 and f64.
  using strategies = train::List<optim::Ddp, optim::Zero1>;
  using host_precisions = train::List<F32, F64>;

  static std::string name() { return "custom"; }
  static std::vector<std::string> preset_names() { return {"tiny"}; }
  static gpt2::Config preset(std::string_view) {
    return {.vocab = 64, .seq = 32, .layers = 2, .heads = 4, .width = 64, .seed = 1, .init_std = 0.02};
  }
  // FLOPs per token for MFU: from the parameters the layers declare (weft/train/flops.hpp).
};

}  // namespace

int main(int argc, char** argv) {
  return weft::train::main<CustomFamily>(argc, argv, "custom_model_train",
                                         "custom_model_train: the decoder of 03_custom_model.hpp, trained by weft's trainer");
}
