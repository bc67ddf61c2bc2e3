// Limits on JSON text, checked before any parser sees it: its size and its nesting depth.
//
// A JSON parser given hostile text can spend memory out of proportion to the text (a DOM is several
// times its size), and the values it builds take recursion in proportion to their nesting:
// nlohmann_json parses iteratively but copies, compares and prints (dump(), as error messages do)
// recursively, so one value 100000 arrays deep overflows the stack. So every JSON document weft reads
// from a file or a peer (checkpoint manifests, safetensors headers and their metadata, cluster
// files) is first scanned here, in one pass that allocates nothing: the byte count against
// `max_bytes`, and the depth of brackets outside strings against `max_depth`. A refusal is a
// weft::Error naming the document, the value found and the limit.
//
//   check_json_limits(text, {.max_bytes = 1 << 20, .max_depth = 8}, "safetensors(model.safetensors) header");
//
// Plain C++20.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "weft/core/error.hpp"

namespace weft {

struct JsonLimits {
  std::uint64_t max_bytes = 1 << 20;
  int max_depth = 16;  // the deepest nesting of arrays and objects accepted (a top-level object is 1)
};

// The deepest nesting of arrays and objects in `text`, brackets inside strings not counted; stops
// counting (and returns) once it exceeds `stop`. Malformed text is the parser's to refuse.
constexpr int json_depth(std::string_view text, int stop) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > stop) return deepest;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// Throws Error(where, ...) when `text` is larger than limits.max_bytes or nests deeper than
// limits.max_depth.
inline void check_json_limits(std::string_view text, const JsonLimits& limits, const std::string& where) {
  if (text.size() > limits.max_bytes)
    throw Error(where, cat("is ", text.size(), " bytes of JSON, over the limit of ", limits.max_bytes),
                "pass a smaller document (this one is not what weft writes)");
  if (const int d = json_depth(text, limits.max_depth); d > limits.max_depth)
    throw Error(where,
                cat("nests JSON arrays and objects ", d, d > limits.max_depth ? " or more" : "",
                    " deep, over the limit of ", limits.max_depth),
                "pass a document of the expected structure (this one is not what weft writes)");
}

// The first `most` characters of a JSON value's text, for messages.
inline std::string brief(std::string_view text, std::size_t most = 64) {
  return text.size() > most ? cat(text.substr(0, most), "...") : std::string(text);
}

}  // namespace weft
