// train_gpt's loop for Llama with context parallelism and sequence parallelism (--model llama
// --context N --strategy <strategy>-sp), in a translation unit of its own beside
// train_gpt_llama_context.cpp, which has the loop without sequence parallelism (train_gpt.cpp declares
// these extern). Built with the Llama family.
#include <weft/train/loop.hpp>

#include "train_gpt_family.hpp"

WEFT_TRAIN_HOST_CONTEXT(, TrainLlama, true)
