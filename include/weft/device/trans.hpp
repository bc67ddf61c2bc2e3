// Whether a GEMM operand is used transposed (ops::Gemm, and the host and
// cuBLASLt GEMMs below it). This header is plain C++20.
#pragma once

namespace weft {

enum class Trans : bool { no = false, yes = true };

}  // namespace weft
