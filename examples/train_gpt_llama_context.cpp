// train_gpt's loop for Llama with context parallelism (--model llama --context N --attention ring
// or all-gather; llama::ContextFamily: f32 on the host, every data strategy), in a translation unit
// of its own beside the others (train_gpt.cpp declares these extern). Built with the Llama family.
#include <weft/train/loop.hpp>

#include "train_gpt_family.hpp"

WEFT_TRAIN_HOST_CONTEXT(, TrainLlama, false)
