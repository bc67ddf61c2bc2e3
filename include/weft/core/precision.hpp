// Precision<Compute, Master>: the numeric policy of a model and its optimizer, as one type.
//
//   policy                    weights, activations   gradients, master weights,   statistics (LayerNorm
//                             (what GEMMs read)      optimizer state, reductions  mean/rstd, softmax, loss)
//   Precision<double>         f64                    f64                          f64   the tests' oracle
//   Precision<float>          f32                    f32                          f32
//   Precision<bf16, float>    bf16                   f32                          f32   mixed precision
//   Precision<bf16, float, G> the linear layers' GEMMs as G says (fp8::Gemms<Scaling, Grad>: their
//                             operands cast to float8, core/float8_gemms.hpp), the rest as above
//                             (Precision<float, float, G>: the same casts in an f32 model, whose
//                             layouts agree to f32's rounding, as the tests compare them)
//
// Under bf16 every op reads bf16 and computes in f32 (GEMMs accumulate in f32), and rounds once
// where it writes a bf16 activation. Parameter gradients are accumulated in f32 buffers (the GEMM
// that produces dW reads bf16 and adds into f32), reduced across ranks in f32, and applied to the
// f32 master weights; the bf16 weights the next forward reads are the master weights rounded once
// per step. The host runs the same policy (bf16 storage, f32 arithmetic), so mixed-precision
// training is tested on every machine. No loss scaling: bf16 has f32's exponent range.
//
// A bare element type stands for its own policy: precision_t<float> is Precision<float>.
//
// This header is plain C++20.
#pragma once

#include <concepts>
#include <string>

#include "weft/core/dtype.hpp"

namespace weft {

// The linear layers' GEMMs in the compute type (every precision's, unless it names other GEMMs).
struct ExactGemms {
  static constexpr bool fp8 = false;
  static std::string name() { return ""; }
};

// GEMMs a precision may name: ExactGemms, or fp8::Gemms (core/float8_gemms.hpp).
template <class G>
concept GemmPolicy = requires {
  { G::fp8 } -> std::convertible_to<bool>;
  { G::name() } -> std::convertible_to<std::string>;
};

template <Floating Compute, Floating Master = accumulate_t<Compute>, GemmPolicy Gemms = ExactGemms>
struct Precision {
  static_assert(std::same_as<Master, accumulate_t<Compute>>,
                "Precision: the master type must be the compute type's accumulation type (f32 for bf16 and f32 "
                "compute, f64 for f64 compute); use Precision<bf16, float>, Precision<float> or Precision<double>");
  static_assert(!Gemms::fp8 || std::same_as<Compute, bf16> || std::same_as<Compute, float>,
                "Precision: FP8 GEMMs take bf16 compute (the activations and weights they cast), or f32 (the "
                "tests' layout checks); use Precision<bf16, float, fp8::Gemms<...>>");
  using compute = Compute;  // weights and activations as the ops read them
  using master = Master;    // gradients, master weights, optimizer state, statistics
  using gemms = Gemms;      // how the linear layers' GEMMs read their operands
  static constexpr bool mixed = !std::same_as<Compute, Master>;
  static std::string name() {
    const std::string g = Gemms::fp8 ? ", " + Gemms::name() : std::string();
    return mixed ? std::string("Precision<") + std::string(weft::name(dtype_of<Compute>)) + ", " +
                       std::string(weft::name(dtype_of<Master>)) + g + ">"
                 : std::string("Precision<") + std::string(weft::name(dtype_of<Compute>)) + g + ">";
  }
};

using F64 = Precision<double>;
using F32 = Precision<float>;
using Bf16Mixed = Precision<bf16, float>;

template <class X> struct is_precision : std::false_type {};
template <class C, class M, class G> struct is_precision<Precision<C, M, G>> : std::true_type {};

// A precision policy, or an element type standing for Precision<T>.
template <class X>
concept PrecisionLike = is_precision<X>::value || Floating<X>;

template <PrecisionLike X> struct precision_of {
  using type = X;
};
template <Floating T> struct precision_of<T> {
  using type = Precision<T>;
};
template <PrecisionLike X> using precision_t = typename precision_of<X>::type;

// The type of a compute type's parameter gradients, master weights and statistics.
template <Floating T> using master_t = accumulate_t<T>;

}  // namespace weft
