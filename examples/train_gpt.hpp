// train_gpt's instantiations of the training loop (weft/train/loop.hpp) for GPT-2 on the host, in
// two translation units that build side by side: without sequence parallelism in train_gpt.cpp
// (beside main), with it in train_gpt_sp.cpp; each holds every precision and data-parallel
// strategy. Every other translation unit of the binary sees them as extern. (Two units of twelve
// rather than more, smaller ones: each unit compiles the model's layers for every precision it
// holds, and this split compiles them fewest times while both cores stay busy.)
#pragma once

#include <weft/models/gpt2/family.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/train/loop.hpp>

#define WEFT_TRAIN_GPT_ONE(EXTERN, P, SP)                                                             \
  WEFT_TRAIN_INSTANTIATE_ONE(EXTERN, weft::gpt2::Family, weft::Host, P, SP, weft::optim::Ddp)   \
  WEFT_TRAIN_INSTANTIATE_ONE(EXTERN, weft::gpt2::Family, weft::Host, P, SP, weft::optim::Zero1) \
  WEFT_TRAIN_INSTANTIATE_ONE(EXTERN, weft::gpt2::Family, weft::Host, P, SP, weft::optim::Zero2) \
  WEFT_TRAIN_INSTANTIATE_ONE(EXTERN, weft::gpt2::Family, weft::Host, P, SP, weft::optim::Fsdp)
#define WEFT_TRAIN_GPT_HOST(EXTERN, SP)              \
  WEFT_TRAIN_GPT_ONE(EXTERN, weft::F32, SP)          \
  WEFT_TRAIN_GPT_ONE(EXTERN, weft::Bf16Mixed, SP)    \
  WEFT_TRAIN_GPT_ONE(EXTERN, weft::F64, SP)

WEFT_TRAIN_GPT_HOST(extern, false)
WEFT_TRAIN_GPT_HOST(extern, true)
