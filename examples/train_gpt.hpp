// train_gpt's instantiations of the training loop (weft/train/loop.hpp) for GPT-2 on the host: one
// translation unit per precision (train_gpt_f32.cpp, _bf16, _f64), each with every data-parallel
// strategy, with and without sequence parallelism, so that the trainer builds on every core. Every
// other translation unit of the binary sees them as extern. (Per precision rather than per
// strategy: a translation unit compiles the model's layers once for each precision it holds, and
// this split compiles them fewest times: 387 s of compiler time at -O3 against 444 s per strategy.)
#pragma once

#include <weft/models/gpt2/family.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/train/loop.hpp>

#define WEFT_TRAIN_GPT_HOST(EXTERN, P)                                                 \
  WEFT_TRAIN_INSTANTIATE(EXTERN, weft::gpt2::Family, weft::Host, P, weft::optim::Ddp)   \
  WEFT_TRAIN_INSTANTIATE(EXTERN, weft::gpt2::Family, weft::Host, P, weft::optim::Zero1) \
  WEFT_TRAIN_INSTANTIATE(EXTERN, weft::gpt2::Family, weft::Host, P, weft::optim::Zero2) \
  WEFT_TRAIN_INSTANTIATE(EXTERN, weft::gpt2::Family, weft::Host, P, weft::optim::Fsdp)

WEFT_TRAIN_GPT_HOST(extern, weft::F32)
WEFT_TRAIN_GPT_HOST(extern, weft::Bf16Mixed)
WEFT_TRAIN_GPT_HOST(extern, weft::F64)
