// train_gpt's loops for GPT-2 with context parallelism and sequence parallelism inside it
// (--model gpt2 --context N --strategy <strategy>-sp), in a translation unit of its own beside
// train_gpt_gpt2_context.cpp (train_gpt.cpp declares these extern).
#include <weft/train/loop.hpp>

#include "train_gpt_family.hpp"

WEFT_TRAIN_HOST_CONTEXT(, TrainGpt2, true)
