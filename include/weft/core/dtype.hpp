// Element types and their traits.
//
// DType names an element type at run time (for messages, collective descriptors and file headers);
// dtype_of<T> maps a C++ type to it at compile time. The Element concept is the closed set of types
// that tensors and communicators move: f64, f32, bf16, i32, i64.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "weft/core/bf16.hpp"

namespace weft {

enum class DType : std::uint8_t { f64, f32, bf16, f16, i32, i64 };

constexpr std::string_view name(DType t) {
  switch (t) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

constexpr std::size_t size_of(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
  }
  return 0;
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << name(t); }

template <class T> inline constexpr bool is_element_v = false;
template <> inline constexpr bool is_element_v<double> = true;
template <> inline constexpr bool is_element_v<float> = true;
template <> inline constexpr bool is_element_v<bf16> = true;
template <> inline constexpr bool is_element_v<std::int32_t> = true;
template <> inline constexpr bool is_element_v<std::int64_t> = true;

// The element types tensors and communicators carry.
template <class T>
concept Element = is_element_v<std::remove_cv_t<T>>;

// Element types with a meaningful sum (every Element is; kept separate for clarity at call sites).
template <class T>
concept Floating = std::same_as<std::remove_cv_t<T>, double> || std::same_as<std::remove_cv_t<T>, float> ||
                   std::same_as<std::remove_cv_t<T>, bf16>;

template <Element T>
inline constexpr DType dtype_of = [] {
  using U = std::remove_cv_t<T>;
  if constexpr (std::same_as<U, double>) return DType::f64;
  else if constexpr (std::same_as<U, float>) return DType::f32;
  else if constexpr (std::same_as<U, bf16>) return DType::bf16;
  else if constexpr (std::same_as<U, std::int32_t>) return DType::i32;
  else return DType::i64;
}();

// The type in which sums of T are accumulated: bf16 adds in float and rounds once.
template <Element T> struct accumulate {
  using type = T;
};
template <> struct accumulate<bf16> {
  using type = float;
};
template <Element T> using accumulate_t = typename accumulate<T>::type;

template <Element T>
constexpr accumulate_t<T> widen(T x) {
  if constexpr (std::same_as<T, bf16>) return static_cast<float>(x);
  else return x;
}
template <Element T>
constexpr T narrow(accumulate_t<T> x) {
  if constexpr (std::same_as<T, bf16>) return bf16(x);
  else return x;
}

}  // namespace weft
