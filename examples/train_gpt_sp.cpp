// train_gpt's loop with sequence parallelism, every precision and strategy (examples/train_gpt.hpp).
#include "train_gpt.hpp"

WEFT_TRAIN_GPT_HOST(, true)
