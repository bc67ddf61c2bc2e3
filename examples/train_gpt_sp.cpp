// train_gpt's loop with sequence parallelism, every precision and strategy of GPT-2's family: a
// translation unit of its own, so that the trainer builds on two cores (train_gpt.cpp declares it
// extern).
#include <weft/models/gpt2/family.hpp>
#include <weft/train/loop.hpp>

WEFT_TRAIN_HOST(, weft::gpt2::Family, true)
