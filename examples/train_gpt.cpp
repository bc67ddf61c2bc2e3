// train_gpt: trains a GPT (or a Llama) on thread ranks or processes (tensor, sequence, context,
// pipeline and data parallel), on the host or GPUs, in f32, bf16 mixed precision or (host) f64, on
// the built-in Markov corpus (whose entropy rate is the loss floor), an llm.c token file, or a text
// file.
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
// A main over weft's trainer (weft/train/main.hpp) and the families examples/CMakeLists.txt lists
// (weft_add_trainer, cmake/WeftTrainer.cmake): the build writes their units and weft_trainer.hpp.
#include "weft_trainer.hpp"

int main(int argc, char** argv) {
  return weft::train::main_of<weft_units::units>(
      argc, argv, "train_gpt",
      "weft train_gpt: a tensor-, sequence-, context-, pipeline- and data-parallel GPT "
      "(or Llama) on thread ranks or processes, on the host or GPUs");
}
