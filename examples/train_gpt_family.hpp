// train_gpt's GPT-2 family, the same type in each of its units: weft's gpt2::Family, or, where the
// build defines WEFT_TRAIN_GPT_NO_F64 (CMake: WEFT_TRAIN_GPT_F64=OFF, as scripts/demo builds it),
// the same family without the host's f64, a third fewer loops to compile for a first run
// (--dtype f64 then says that it is not compiled, and names what is).
//
// And its Llama family (--model llama): weft's llama::Family, or, where the build defines
// WEFT_TRAIN_GPT_NO_LLAMA_CUDA (CMake: WEFT_TRAIN_GPT_LLAMA_CUDA=OFF, as the dev preset builds it),
// the same family without its GPU half (--device cuda then says so), one CUDA unit fewer to compile.
#pragma once

#include "weft/models/gpt2/family.hpp"
#ifdef WEFT_TRAIN_GPT_LLAMA
#include "weft/models/llama/family.hpp"
#endif

#ifdef WEFT_TRAIN_GPT_NO_F64
struct TrainGpt2 : weft::gpt2::Family {
  using host_precisions = weft::train::List<weft::F32, weft::Bf16Mixed>;
};
#else
using TrainGpt2 = weft::gpt2::Family;
#endif

#ifdef WEFT_TRAIN_GPT_LLAMA
#ifdef WEFT_TRAIN_GPT_NO_LLAMA_CUDA
struct TrainLlama : weft::llama::Family {
  static constexpr bool gpu = false;
};
#else
using TrainLlama = weft::llama::Family;
#endif
#endif
