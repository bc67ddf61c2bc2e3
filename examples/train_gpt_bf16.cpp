// train_gpt's loop in bf16 mixed precision, every strategy (examples/train_gpt.hpp).
#include "train_gpt.hpp"

WEFT_TRAIN_GPT_HOST(, weft::Bf16Mixed)
