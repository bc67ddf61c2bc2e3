// train_gpt's loop with sequence parallelism, every precision and strategy of GPT-2's family: a
// translation unit of its own, so that the trainer builds on two cores (train_gpt.cpp declares it
// extern). It also compiles the host GEMM's Eigen instantiations, which train_gpt's other units
// declare extern (WEFT_HOST_GEMM_COMPILED, examples/CMakeLists.txt): here, beside main's unit on
// the other core, rather than in weft::host_gemm, which would build alone before either.
#include <weft/device/host/gemm_instances.hpp>
#include <weft/train/loop.hpp>

#include "train_gpt_family.hpp"

WEFT_TRAIN_HOST(, TrainGpt2, true)
