// train_gpt's GPT-2 family, the same type in each of its units: weft's gpt2::Family, or, where the
// build defines WEFT_TRAIN_GPT_NO_F64 (CMake: WEFT_TRAIN_GPT_F64=OFF, as scripts/demo builds it),
// the same family without the host's f64, a third fewer loops to compile for a first run
// (--dtype f64 then says that it is not compiled, and names what is).
//
// And its Llama family (--model llama): weft's llama::Family, or, where the build defines
// WEFT_TRAIN_GPT_NO_LLAMA_CUDA (CMake: WEFT_TRAIN_GPT_LLAMA_CUDA=OFF, as the dev preset builds it),
// the same family without its GPU half (--device cuda then says so), one CUDA unit fewer to compile;
// its tied-head family (llama::TiedFamily, with_tied_head) likewise.
//
// Where the build defines WEFT_TRAIN_GPT_NO_CONTEXT (CMake: WEFT_TRAIN_GPT_CONTEXT=OFF, as scripts/demo
// builds it), both families without their context-parallel loops (--context then names the option).
#pragma once

#include "weft/models/gpt2/family.hpp"
#ifdef WEFT_TRAIN_GPT_LLAMA
#include "weft/models/llama/family.hpp"
#endif

namespace train_gpt_detail {
#ifdef WEFT_TRAIN_GPT_NO_F64
struct Gpt2 : weft::gpt2::Family {
  using host_precisions = weft::train::List<weft::F32, weft::Bf16Mixed>;
};
#else
using Gpt2 = weft::gpt2::Family;
#endif
#ifdef WEFT_TRAIN_GPT_LLAMA
#ifdef WEFT_TRAIN_GPT_NO_LLAMA_CUDA
struct Llama : weft::llama::Family {
  static constexpr bool gpu = false;
  struct with_tied_head : weft::llama::TiedFamily {
    static constexpr bool gpu = false;
  };
};
#else
using Llama = weft::llama::Family;
#endif
#endif

// F as built: without its context-parallel loops where the build leaves them out.
#ifdef WEFT_TRAIN_GPT_NO_CONTEXT
template <class F>
struct Built : F {
  static constexpr bool context_compiled = false;
};
#else
template <class F>
using Built = F;
#endif
}  // namespace train_gpt_detail

using TrainGpt2 = train_gpt_detail::Built<train_gpt_detail::Gpt2>;
#ifdef WEFT_TRAIN_GPT_LLAMA
using TrainLlama = train_gpt_detail::Built<train_gpt_detail::Llama>;
using TrainLlamaTied = TrainLlama::with_tied_head;  // where the configuration ties the LM head
#endif
