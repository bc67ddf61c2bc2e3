// train_gpt: trains a GPT on thread ranks (tensor x data parallel), on the host or on one GPU that
// the ranks share, in f32, bf16 mixed precision or (host) f64, on the built-in Markov corpus (whose
// entropy rate is the loss floor), an llm.c token file, or a text file.
//
//   train_gpt                                   a tiny GPT, tensor 2 x data 2, on the built-in corpus
//   train_gpt --device cuda --dtype bf16        the same on the GPU in mixed precision
//   train_gpt --text book.txt --sample 200      byte-level GPT on a text, then 200 sampled bytes
//   train_gpt --help                            every option
//
// A thin command line over weft's trainer (weft/train/main.hpp) with GPT-2's family
// (weft/models/gpt2/family.hpp): --model gpt2. Run-time choices (device, strategy, dtype) cross into
// types in one place, train::dispatch; the loop's host instantiations are compiled in two units
// that build side by side, this one (without sequence parallelism) and train_gpt_sp.cpp (with it),
// and its GPU half in train_gpt_cuda.cu.
#include <weft/models/gpt2/family.hpp>
#include <weft/models/gpt2/run_plan.hpp>
#include <weft/train/main.hpp>

WEFT_TRAIN_HOST(extern, weft::gpt2::Family, true)  // in train_gpt_sp.cpp

int main(int argc, char** argv) {
  return weft::train::main<weft::gpt2::Family>(
      argc, argv, "train_gpt", "weft train_gpt: a tensor- and data-parallel GPT on thread ranks, on the host or one GPU");
}
