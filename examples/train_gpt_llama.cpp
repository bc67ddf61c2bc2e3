// train_gpt's loop for the Llama family (--model llama), with and without sequence parallelism, in
// a translation unit of its own so that it builds beside GPT-2's two (train_gpt.cpp declares these
// extern). Left out where WEFT_TRAIN_GPT_LLAMA is OFF (scripts/demo: GPT-2 only, a faster build).
#include <weft/train/loop.hpp>

#include "train_gpt_family.hpp"

WEFT_TRAIN_HOST(, TrainLlama, false)
WEFT_TRAIN_HOST(, TrainLlama, true)
