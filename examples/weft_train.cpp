// weft-train: trains GPT-2, Llama or any family it is built with, on thread ranks or processes (tensor, sequence,
// context, pipeline and data parallel), on the host or GPUs, in f32, bf16 mixed precision or (host) f64, on the
// built-in Markov corpus (whose entropy rate is the loss floor), an llm.c token file, or a text file.
//
//   weft-train                                   a tiny GPT, tensor 2 x data 2, on the built-in corpus
//   weft-train --device cuda --dtype bf16        the same on the GPU in mixed precision
//   weft-train --text book.txt --sample 200      byte-level GPT on a text, then 200 sampled bytes
//   weft-train --help                            every option
//
//   weft-train --model llama                     Llama (llama-tiny: GQA, rotary, SwiGLU) the same way
//   weft-train --model llama --context 2         its sequence over 2 context ranks (ring attention)
//   weft-train --model llama --tie-embeddings true  its LM head reading the embedding table
//   weft-train --context 2 --attention all-gather  GPT-2's the same way, keys and values gathered
//   weft-train --model dit --objective flow      a class-conditional DiT on synthetic latents (rectified
//                                                flow; --records and --labels: latent record files)
//
// Called train_gpt (its name until weft 0.1: the build links train_gpt to it) it runs the same,
// after a line on stderr saying that the old name goes in the next release.
//
// A main over weft's trainer (weft/train/main.hpp) and the families examples/CMakeLists.txt lists
// (weft_add_trainer, cmake/WeftTrainer.cmake): the build writes their units and weft_trainer.hpp.
#include <cstdio>
#include <string_view>

#include "weft_trainer.hpp"

int main(int argc, char** argv) {
  std::string_view called = argc > 0 ? argv[0] : "weft-train";
  called = called.substr(called.find_last_of('/') + 1);
  const bool alias = called == "train_gpt";
  if (alias)
    std::fprintf(stderr,
                 "train_gpt: the old name of weft-train, kept as an alias for this release only; call weft-train\n");
  return weft::train::main_of<weft_units::units>(
      argc, argv, alias ? "train_gpt" : "weft-train",
      "weft-train: a tensor-, sequence-, context-, pipeline- and data-parallel trainer of GPT-2, Llama "
      "and any model family it is built with, on thread ranks or processes, on the host or GPUs");
}
