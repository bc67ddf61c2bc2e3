// train_gpt's loops for GPT-2 with context parallelism (--model gpt2 --context N --attention ring
// or all-gather; gpt2::ContextFamily: f32 on the host, every data strategy), without sequence
// parallelism, in a translation unit of its own (train_gpt.cpp declares these extern).
#include <weft/train/loop.hpp>

#include "train_gpt_family.hpp"

WEFT_TRAIN_HOST_CONTEXT(, TrainGpt2, false)
