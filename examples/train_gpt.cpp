// train_gpt: trains a GPT on thread ranks (tensor x data parallel), on the host or on one GPU that
// the ranks share, in f32, bf16 mixed precision or (host) f64, on the built-in Markov corpus (whose
// entropy rate is the loss floor), an llm.c token file, or a text file.
//
//   train_gpt                                   a tiny GPT, tensor 2 x data 2, on the built-in corpus
//   train_gpt --device cuda --dtype bf16        the same on the GPU in mixed precision
//   train_gpt --text book.txt --sample 200      byte-level GPT on a text, then 200 sampled bytes
//   train_gpt --help                            every option
//
//   train_gpt --model llama                     Llama (llama-tiny: GQA, rotary, SwiGLU) the same way
//   train_gpt --model llama --context 2         its sequence over 2 context ranks (ring attention)
//   train_gpt --model llama --tie-embeddings true  its LM head reading the embedding table
//   train_gpt --context 2 --attention all-gather  GPT-2's the same way, keys and values gathered
//
// A thin command line over weft's trainer (weft/train/main.hpp) with GPT-2's family
// (weft/models/gpt2/family.hpp, --model gpt2) and Llama's (weft/models/llama/family.hpp, --model
// llama; its loop in train_gpt_llama.cpp, and with a tied LM head in train_gpt_llama_tied.cpp). With context parallelism (--context), each family's
// loops in units of their own: train_gpt_gpt2_context.cpp and train_gpt_llama_context.cpp, and with
// sequence parallelism as well, their _sp.cpp. Run-time choices (device, strategy, dtype) cross into
// types in one place, train::dispatch; the loop's host instantiations are compiled in two units
// that build side by side, this one (without sequence parallelism) and train_gpt_sp.cpp (with it,
// and the host GEMM's Eigen code), and its GPU half in train_gpt_cuda.cu. GPT-2's family type is
// train_gpt_family.hpp's (scripts/demo leaves f64 out).
#include "train_gpt_family.hpp"
#include <weft/models/gpt2/run_plan.hpp>
#include <weft/train/main.hpp>

WEFT_TRAIN_HOST(extern, TrainGpt2, true)  // in train_gpt_sp.cpp
#ifndef WEFT_TRAIN_GPT_NO_CONTEXT
WEFT_TRAIN_HOST_CONTEXT(extern, TrainGpt2, false)  // in train_gpt_gpt2_context.cpp
WEFT_TRAIN_HOST_CONTEXT(extern, TrainGpt2, true)   // in train_gpt_gpt2_context_sp.cpp
#endif
#ifdef WEFT_TRAIN_GPT_LLAMA
WEFT_TRAIN_HOST(extern, TrainLlama, false)  // in train_gpt_llama.cpp
WEFT_TRAIN_HOST(extern, TrainLlama, true)
WEFT_TRAIN_HOST(extern, TrainLlamaTied, false)  // in train_gpt_llama_tied.cpp
WEFT_TRAIN_HOST(extern, TrainLlamaTied, true)
#ifndef WEFT_TRAIN_GPT_NO_CONTEXT
WEFT_TRAIN_HOST_CONTEXT(extern, TrainLlama, false)  // in train_gpt_llama_context.cpp
WEFT_TRAIN_HOST_CONTEXT(extern, TrainLlama, true)   // in train_gpt_llama_context_sp.cpp
#endif
#endif

int main(int argc, char** argv) {
  constexpr const char* about = "weft train_gpt: a tensor-, sequence-, pipeline- and data-parallel GPT (or Llama) on thread "
                                "ranks or processes, on the host or GPUs";
#ifdef WEFT_TRAIN_GPT_LLAMA
  return weft::train::main<TrainGpt2, TrainLlama>(argc, argv, "train_gpt", about);
#else
  return weft::train::main<TrainGpt2>(argc, argv, "train_gpt", about);
#endif
}
