// The rows of describe's table of any model (describe.hpp) from its layers: a walk over a built model's parts.
//
// Each layer of the protocol (nn/sequential.hpp) gives its rows:
//   a layer with comm_rows(out, name, act, s, e)          those (the attention: its projections and
//                                                         its core, whose context-axis sends or
//                                                         gathers need its head counts; Mlp's two)
//   Named<"attn", L>                                      L's, under "<name>.attn"
//   Sequential<Ls...>                                     each layer's in order, under its name (or,
//                                                         unnamed, its neighbours'), and a row for
//                                                         each redistribution Sequential inserts
//   Residual<Inner>                                       Inner's (the add moves nothing)
//   Either<A, B>                                          the held layer's
//   TokenWise<L> (context parallelism)                    L's, on a context rank's T / c rows
//   recompute::Checkpointed<L> (Full)                     L's, each row's forward collectives again
//                                                         in its backward (the forward is re-run)
//   Redistribute<...> (CopyToTensor, ...)                 its forward and backward collectives
//   any other layer                                       a row of its layouts, no collectives
// The activation's global shape is followed through the layers (out_shape), so a redistribution
// is counted at the width it moves. The embedding and head stages give their rows (nn/stages.hpp:
// comm_rows(out, act, s, e); comm_rows(out, config, act, s, e)), and the
// data-parallel step adds one all-reduce on the tensor axis for every gradient that is Partial
// there (sequence parallelism's norm weights), as DDP runs it.
//
// A layer that runs collectives inside itself (not through a Redistribute) declares them with a
// comm_rows (static, or a const member); tests/cost/measure.cpp holds the walk to the collectives a
// run counts, tests/context/plan.cpp the context axis's.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "weft/nn/comm.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/embedding.hpp"
#include "weft/nn/layer_walk.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/recompute/checkpointed.hpp"

namespace weft::nn {

namespace detail {

template <class T> inline constexpr bool is_redistribute = false;
template <LayoutType F, LayoutType To, LayoutType GT, LayoutType GF>
inline constexpr bool is_redistribute<Redistribute<F, To, GT, GF>> = true;

template <class L>
concept WritesCommRows = requires(const L& l, std::vector<CommRow>& out, const std::string& n, const Shape& a,
                                  const Spread& s, std::int64_t e) { l.comm_rows(out, n, a, s, e); };

}  // namespace detail

// Appends layer's rows under `name` for an input of global shape `in`; returns its output's shape.
// e: the bytes of an element.
template <class L>
Shape layer_comm_rows(std::vector<CommRow>& out, const std::string& name, const L& layer, const Shape& in,
                      const Spread& s, std::int64_t e);

namespace detail {

// A layer's name in a row: its Named label, else its type's name.
template <class L>
std::string label_of() {
  if constexpr (walk::token_wise<L>) return label_of<typename L::inner_type>();
  else if constexpr (is_named<L>) return L::label();
  else return L::name();
}

// Layer I of a Sequential and what follows it; x: the activation's global shape, in and out. A layer
// without a name of its own (a redistribution, an elementwise op) is named by its neighbours
// ("h0: ln1 -> attn"), as its position alone repeats in each branch of a block.
template <std::size_t I, class... Ls>
void sequential_rows(std::vector<CommRow>& out, const std::string& name, const Sequential<Ls...>& seq, Shape& x,
                     const Spread& s, std::int64_t e) {
  using Types = std::tuple<Ls...>;
  using A = std::tuple_element_t<I, Types>;
  std::string row = name;
  if constexpr (!is_named<A> && !is_residual<A>) {
    std::string before = "in", after = "out";
    if constexpr (I > 0) before = label_of<std::tuple_element_t<I - 1, Types>>();
    if constexpr (I + 1 < sizeof...(Ls)) after = label_of<std::tuple_element_t<I + 1, Types>>();
    row = cat(name, ": ", before, " -> ", after);
  }
  x = layer_comm_rows(out, row, std::get<I>(seq.layers), x, s, e);
  if constexpr (I + 1 < sizeof...(Ls)) {
    using B = std::tuple_element_t<I + 1, Types>;
    if constexpr (!std::same_as<typename A::Out, typename B::In>) {  // the redistribution Sequential inserts
      using Inserted = Redistribute<typename A::Out, typename B::In, typename B::GradIn, typename A::GradOut>;
      out.push_back(pair_row<Inserted>(
          cat(name, ": ", label_of<A>(), " -> ", label_of<B>(), " (inserted ", Inserted::name(), ")"), x, s, e));
    }
    sequential_rows<I + 1>(out, name, seq, x, s, e);
  }
}

}  // namespace detail

template <class L>
Shape layer_comm_rows(std::vector<CommRow>& out, const std::string& name, const L& layer, const Shape& in,
                      const Spread& s, std::int64_t e) {
  // Named first: it derives from its layer, so it has the layer's comm_rows too, and must add its
  // name. (A checkpointed layer with rows of its own states its recomputation itself.)
  if constexpr (walk::token_wise<L>) {  // L on a context rank's T / c rows, as a sequence of its own
    Shape rows = in;
    rows[1] = in[1] / s.context_degree;
    Shape y = layer_comm_rows(out, name, layer.inner, rows, s, e);
    y[1] = in[1];
    return y;
  } else if constexpr (detail::is_named<L>) {
    using Base = typename walk::base<L>::type;
    return layer_comm_rows(out, cat(name, ".", L::label()), static_cast<const Base&>(layer), in, s, e);
  } else if constexpr (detail::WritesCommRows<L>) {
    layer.comm_rows(out, name, in, s, e);
    return layer.out_shape(in);
  } else if constexpr (walk::checkpointed<L>) {
    using Base = typename walk::base<L>::type;
    const std::size_t first = out.size();
    const Shape y = layer_comm_rows(out, name, static_cast<const Base&>(layer), in, s, e);
    for (std::size_t i = first; i < out.size(); ++i)  // backward re-runs the forward first
      out[i].backward.insert(out[i].backward.begin(), out[i].forward.begin(), out[i].forward.end());
    return y;
  } else if constexpr (detail::is_residual<L>) {
    return layer_comm_rows(out, name, layer.inner, in, s, e);
  } else if constexpr (walk::either<L>) {
    return layer.visit([&](const auto& held) { return layer_comm_rows(out, name, held, in, s, e); });
  } else if constexpr (walk::sequential<L>) {
    Shape x = in;
    detail::sequential_rows<0>(out, name, layer, x, s, e);
    return x;
  } else if constexpr (detail::is_redistribute<L>) {
    out.push_back(detail::pair_row<L>(cat(name, " (", L::name(), ")"), in, s, e));
    return in;
  } else {
    out.push_back({cat(name, " (", L::name(), ")"), L::In::name(), L::Out::name(), {}, {}});
    return layer.out_shape(in);
  }
}

// A model's stages have rows: the embedding's and the head's comm_rows (as nn/stages.hpp's).
template <class Model>
concept Describable = requires(std::vector<CommRow>& out, const typename Model::config_type& c, const Shape& a,
                               const Spread& s, std::int64_t e) {
  Model::Embedding::comm_rows(out, a, s, e);
  Model::Head::comm_rows(out, c, a, s, e);
};

// The rows of a model built whole (every block) for a global micro-batch
// `batch` and the degrees in s: the embedding's, each block's, the head's, then the data-parallel
// step's all-reduce of the gradients Partial on tensor.
template <Describable Model>
std::vector<CommRow> walked_comm_rows(Model& model, std::int64_t batch, const Spread& s) {
  using T = typename Model::T;
  const auto& c = model.config;
  if (static_cast<std::int64_t>(model.blocks.size()) != c.layers)
    throw Error(cat(Model::spec::name(), " describe"),
                cat("the model holds ", model.blocks.size(), " of its ", c.layers, " blocks"),
                "walk a model built whole (no pipeline placement)");
  const std::int64_t e = sizeof(T);
  const Shape act{batch, c.seq, c.width};
  std::vector<CommRow> out;
  Model::Embedding::comm_rows(out, act, s, e);
  for (std::int64_t l = 0; l < c.layers; ++l)
    layer_comm_rows(out, Model::spec::block_name(l), model.blocks[static_cast<std::size_t>(l)], act, s, e);
  Model::Head::comm_rows(out, c, act, s, e);
  std::int64_t partial = 0;  // bytes of the gradients Partial on tensor, in the master type
  model.for_each_param([&](const std::string&, auto& p) {
    using P = std::remove_cvref_t<decltype(p)>;
    if constexpr (is_partial_on<typename P::grad_layout, Axis::tensor>)
      partial += p.grad.numel() * static_cast<std::int64_t>(sizeof(typename P::grad_type));
  });
  if (partial > 0 && s.tensor_degree > 1)
    out.push_back({"gradients Partial on tensor, per step",
                   "-",
                   "-",
                   {},
                   {},
                   {detail::reduction(Axis::tensor, s.tensor_degree, partial)}});
  return out;
}

}  // namespace weft::nn
