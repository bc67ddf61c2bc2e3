// A micro-batch of whatever a model reads: the inputs its Spec declares (Spec::Inputs; language
// models: nn::Tokens), this data rank's samples of each, with the global batch size and the
// gradient scale.
//
// An input type is a struct of fields, each a span over this data rank's samples, sample-major:
//   (B/dp, ...)  the samples' values, in host memory when the caller hands the batch over and in
//                the device's memory once StagedModel::in_flight has copied them there
// listing them by for_each_field(f), f(name, span&) in a fixed order (in_flight points the spans at
// the device's copies through it), and saying what it needs of
// the model's configuration in check(config, local_batch, where), which refuses a field of the
// wrong size or with values out of range by name. Every field is sharded over the data axis by
// its first dimension (each data rank reads its own samples) and whole on every other axis: every
// pipe rank holds the same batch, and a stage under context parallelism takes the rows of its
// context rank from the whole sequences (context::Chunks::rows), as the token stages do. The first
// stage (Spec::Embedding) and the head (Spec::Head) read the fields they need; the blocks between
// see only the stream (and a padded batch's lengths: a field `lengths`, nn::PaddedInputs, which
// nn/padding.hpp hands the layers).
//
//   struct Latents {                                  // a diffusion model's batch
//     std::span<const float> latents, noise;          // (B/dp, C, H, W) each
//     std::span<const std::int32_t> labels;           // (B/dp)
//     std::span<const float> timesteps;               // (B/dp)
//     template <class F> void for_each_field(F&& f) { f("latents", latents); ... }
//     void check(const Config& c, std::int64_t b, const std::string& where) const { ... }
//   };
//   using MyBatch = nn::Batch<Latents>;   // {{latents, noise, labels, timesteps}, batch, grad_scale}
//
// An input type that also says each field's values a sample, per_sample(config) (in
// for_each_field's order), can be planned: nn::ZeroInputs makes a micro-batch of zeros of those
// sizes, which the plan (cost/measure.hpp) runs on the Meta device (its counts do not depend on the
// values; zeros are in range for every field weft's models read: ids, labels, features; a padded
// batch's lengths are the whole sequence).
//
// defines: nn::Batch, nn::PaddedInputs, nn::Tokens, nn::MicroBatch, nn::seq_of, nn::Inputs, nn::check_field,
// nn::inputs_t,
//   nn::PlannedInputs, nn::ZeroInputs
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "weft/core/error.hpp"

namespace weft::nn {

namespace detail {
// A visitor that accepts every field (the concept's probe).
struct AnyField {
  template <class E>
  void operator()(const char*, std::span<const E>&) const {}
};
}  // namespace detail

template <class I>
concept Inputs = std::copyable<I> && requires(I& in, detail::AnyField f) { in.for_each_field(f); };

// Inputs with a field `lengths`, (B/dp) int32: samples padded at the end past their length
// (nn/padding.hpp says what reads them).
template <class I>
concept PaddedInputs = Inputs<I> && requires(const I& in) {
  { in.lengths } -> std::convertible_to<std::span<const std::int32_t>>;
};

// The micro-batch: the inputs (their fields are the Batch's own members), the global batch B and
// the scale of every gradient (1/k when accumulating k micro-batches).
template <Inputs In>
struct Batch : In {
  std::int64_t batch = 0;   // B, the global micro-batch
  double grad_scale = 1.0;  // multiplies every gradient
};

// A field's size against what the model expects: n elements for the local batch, refused naming the
// field and both sizes.
template <class E>
void check_field(std::span<const E> field, std::int64_t n, const char* name, const std::string& where,
                 const std::string& per_sample) {
  if (static_cast<std::int64_t>(field.size()) != n)
    throw Error(where, cat("the field '", name, "' holds ", field.size(), " values where the local batch needs ", n),
                cat("pass (batch / data degree) x ", per_sample, " values"));
}

// A language model's inputs: tokens and next-token targets, (B/dp, T) each.
struct Tokens {
  std::span<const std::int32_t> tokens, targets;

  template <class F>
  void for_each_field(F&& f) {
    f("tokens", tokens);
    f("targets", targets);
  }
  template <class C>
  static std::vector<std::int64_t> per_sample(const C& c) {
    return {c.seq, c.seq};
  }
  // b sequences of the configuration's seq, every id in [0, vocab).
  template <class C>
  void check(const C& c, std::int64_t b, const std::string& where) const {
    const std::int64_t N = b * c.seq;
    check_field(tokens, N, "tokens", where, cat("seq (", c.seq, ")"));
    check_field(targets, N, "targets", where, cat("seq (", c.seq, ")"));
    for (std::int64_t i = 0; i < N; ++i) {
      const auto t = tokens[static_cast<std::size_t>(i)], y = targets[static_cast<std::size_t>(i)];
      if (t < 0 || t >= c.vocab || y < 0 || y >= c.vocab)
        throw Error(where,
                    cat("token ", t, " or target ", y, " at position ", i, " is outside the vocabulary of ", c.vocab),
                    "pass ids in [0, vocab)");
    }
  }
};
static_assert(Inputs<Tokens>);

// A language model's micro-batch, and the length T of its sequences: its tokens over the B/dp
// sequences of a data rank.
using MicroBatch = Batch<Tokens>;
inline std::int64_t seq_of(const MicroBatch& in, int data_degree) {
  const std::int64_t local = in.batch / data_degree;
  return local > 0 ? static_cast<std::int64_t>(in.tokens.size()) / local : 0;
}

// A Spec's inputs: Spec::Inputs where it names them, else tokens.
template <class Spec>
struct inputs_of {
  using type = Tokens;
};
template <class Spec>
  requires requires { typename Spec::Inputs; }
struct inputs_of<Spec> {
  using type = typename Spec::Inputs;
};
template <class Spec>
using inputs_t = typename inputs_of<Spec>::type;

template <class I, class C>
concept PlannedInputs = Inputs<I> && requires(const C& c) {
  { I::per_sample(c) } -> std::convertible_to<std::vector<std::int64_t>>;
};

// `local` samples of zeros of every field of In, in host memory it owns (inputs() points into it).
template <Inputs In>
class ZeroInputs {
 public:
  template <class C>
    requires PlannedInputs<In, C>
  ZeroInputs(const C& c, std::int64_t local) {
    const std::vector<std::int64_t> per = In::per_sample(c);
    std::size_t k = 0;
    in_.for_each_field([&]<class E>(const char* name, std::span<const E>& field) {
      if (k >= per.size())
        throw Error("nn::ZeroInputs", cat("per_sample lists ", per.size(), " fields; '", name, "' is one more"),
                    "give per_sample one size for each field for_each_field lists");
      const auto n = static_cast<std::size_t>(local * per[k++]);
      store_.emplace_back(n * sizeof(E));  // value-initialized: zeros
      field = std::span<const E>(reinterpret_cast<const E*>(store_.back().data()), n);
      elements_ += static_cast<std::int64_t>(n);
    });
    if constexpr (PaddedInputs<In>) {                                 // zero is no length: every sample whole
      auto* lengths = const_cast<std::int32_t*>(in_.lengths.data());  // in store_, ours
      std::fill(lengths, lengths + in_.lengths.size(), static_cast<std::int32_t>(c.seq));
    }
  }
  const In& inputs() const { return in_; }
  std::int64_t elements() const { return elements_; }  // of every field

 private:
  In in_{};
  std::int64_t elements_ = 0;
  std::vector<std::vector<std::byte>> store_;  // no element type has an alignment above a byte vector's
};

}  // namespace weft::nn
