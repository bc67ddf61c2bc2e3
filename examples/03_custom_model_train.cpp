// A trainer binary for the decoder of 03_custom_model.hpp, from weft's trainer library: the model's
// family (03_custom_model_family.hpp, a few lines) and a main. Everything weft-train does comes with
// it: thread ranks or mpirun, tensor, sequence, pipeline and data parallelism, gradient
// accumulation, clipping, the learning-rate schedule, evaluation, checkpoints that resume on any
// mesh, signals, logs, traces.
//
//   custom_model_train --steps 50 --data 2 --tensor 2 --strategy zero1-sp
//   custom_model_train --pipe 2 --schedule zb --save-dir ck && custom_model_train --resume ck/step_50 --steps 80
//   custom_model_train --help
#include "03_custom_model_family.hpp"

#include <weft/train/main.hpp>

int main(int argc, char** argv) {
  return weft::train::main<custom::Family>(
      argc, argv, "custom_model_train",
      "custom_model_train: the decoder of 03_custom_model.hpp, trained by weft's trainer");
}
