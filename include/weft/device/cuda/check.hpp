// Checking every CUDA and cuBLAS call: a failure becomes weft::Error naming the op and CUDA's own
// words, never an abort. check_launch() is called right after every kernel launch (llm.c's habit),
// so a bad launch configuration is reported at the op that made it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "weft/core/error.hpp"

namespace weft::cuda {

inline void check(cudaError_t e, const char* op) {
  if (e != cudaSuccess)
    throw Error(cat("cuda: ", op), cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
                "check the sizes passed to the op; an earlier asynchronous error may also surface here");
}

inline void check(cublasStatus_t s, const char* op) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(cat("cublasLt: ", op), cat("status ", static_cast<int>(s), " (", cublasGetStatusString(s), ")"),
                "check the matrix sizes, leading dimensions and alignment of the operands");
}

// After a launch: the launch's own error (bad configuration), without synchronizing.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace weft::cuda
