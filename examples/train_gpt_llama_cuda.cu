// train_gpt's GPU half for the Llama family (nvcc): the training loop on the GPU
// (weft/train/devices.cuh), every strategy in f32 and bf16 mixed precision, its head untied or tied, in a unit of its own so
// that it builds beside GPT-2's. Built into train_gpt in CUDA builds with WEFT_TRAIN_GPT_LLAMA; the
// command line (weft/train/main.hpp) calls it for --model llama --device cuda.
#include "weft/train/devices.cuh"

#include "train_gpt_family.hpp"

template int weft::train::train_on_cuda<TrainLlama>(const weft::train::Options&, const weft::llama::Config&,
                                                    const weft::train::Corpus&, const weft::train::Launch&);
template int weft::train::train_on_cuda<TrainLlamaTied>(const weft::train::Options&, const weft::llama::Config&,
                                                        const weft::train::Corpus&, const weft::train::Launch&);
