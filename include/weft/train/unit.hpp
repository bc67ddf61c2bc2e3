// defines: train::Build, train::Unit and train::train_unit, what a trainer binary compiles: a unit is
// one translation unit's share of the loop's instantiations (a family on a device, with or without
// sequence parallelism: every variant, strategy and precision of it that the build keeps), and
// train_unit<U> its entry point, which the command line's dispatch (train/dispatch.hpp) calls.
//
// The CMake function weft_add_trainer (cmake/WeftTrainer.cmake) writes the units of a binary from
// its list of families, one source file each, and a header that names them all (`using units =
// train::List<Unit<...>, ...>`) and declares each train_unit<U> extern where main is compiled:
//
//   // generated: gpt2_host_sp.cpp                  // generated: weft_train_units.hpp, included by main
//   #include <weft/train/loop.hpp>                  using units = List<Unit<gpt2::Family, Host, false, B>, ...>;
//   #include "weft_train_units.hpp"                  WEFT_TRAIN_UNIT(extern, weft_train_units::gpt2_host_sp)
//   WEFT_TRAIN_UNIT(, weft_train_units::gpt2_host_sp)
//
// A binary without generated units (a user's trainer in one file, train::main<MyFamily>) compiles
// every unit beside main.
#pragma once

#include <cstddef>
#include <type_traits>

#include "weft/core/float8_gemms.hpp"
#include "weft/core/precision.hpp"
#include "weft/train/corpus.hpp"
#include "weft/train/family.hpp"
#include "weft/train/options.hpp"

namespace weft::train {

// A build's choices for all its units: the precisions it compiles (of those each variant runs in)
// and whether it compiles the context-parallel variants.
template <class Precisions = List<F32, Bf16Mixed, F64, Fp8Tensorwise, Fp8Rowwise, Fp8Blockwise>, bool Context = true>
struct Build {
  using precisions = Precisions;
  static constexpr bool context = Context;
};

// Family F on device D (Host or Cuda), with sequence parallelism or without: the variants of F that
// run on D and that the build keeps, each in its precisions on D that the build keeps, each with
// every strategy of F.
template <Family F, class D, bool SP, class B = Build<>>
struct Unit {
  using family = F;
  using device = D;
  using build = B;
  // The family's configuration (train_unit's parameter: a member type, which GCC, nvcc's host
  // compiler, and clang mangle alike, where the alias config_t<F> in a signature they do not).
  using config = config_t<F>;
  static constexpr bool sequence_parallel = SP;
  template <class V>
  using precisions = intersect_t<precisions_t<F, V, D>, typename B::precisions>;
  template <class V>
  struct kept : std::bool_constant<(B::context || !V::context_parallel) && (size_v<precisions<V>> > 0)> {};
  using variants = filter_t<variants_t<F>, kept>;
};

// Trains variant `variant` (an index into U::variants) of U's family with the options' strategy and
// precision; returns the loop's exit status (train/loop.hpp defines it; train/dispatch.hpp checks
// every choice against the unit before calling it).
template <class U>
int train_unit(const Options& o, const typename U::config& cfg, const Corpus& corpus, const Launch& launch,
               std::size_t variant);

}  // namespace weft::train

// train_unit<U>'s explicit instantiation: `template` in the unit's own source, `extern template`
// where main is compiled.
#define WEFT_TRAIN_UNIT(EXTERN, U)                                                              \
  EXTERN template int weft::train::train_unit<U>(const weft::train::Options&, const U::config&, \
                                                 const weft::train::Corpus&, const weft::train::Launch&, std::size_t);
