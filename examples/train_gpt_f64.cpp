// train_gpt's loop in f64, every strategy (examples/train_gpt.hpp).
#include "train_gpt.hpp"

WEFT_TRAIN_GPT_HOST(, weft::F64)
