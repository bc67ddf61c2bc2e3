// train_gpt's loop for the Llama family with a tied LM head (llama::TiedFamily: the llama-3.2-1b
// preset, --tie-embeddings true, a transformers directory with tie_word_embeddings), with and without
// sequence parallelism, in a translation unit of its own that builds beside the untied one
// (train_gpt.cpp declares these extern). Left out where WEFT_TRAIN_GPT_LLAMA is OFF.
#include <weft/train/loop.hpp>

#include "train_gpt_family.hpp"

WEFT_TRAIN_HOST(, TrainLlamaTied, false)
WEFT_TRAIN_HOST(, TrainLlamaTied, true)
