// libFuzzer target: the safetensors header parser on arbitrary bytes. Every input either parses
// into a header consistent with its length or is refused with a weft::Error; anything else (a
// crash, a sanitizer report, another exception, a hang) is a bug. Run: docs/checkpoints.md.
#include <cstdint>
#include <span>

#include "weft/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto h = weft::checkpoint::parse_header(std::span<const unsigned char>(data, size), "fuzz");
    std::uint64_t end = 0;
    for (const auto& t : h.tensors) end = t.end > end ? t.end : end;
    if (h.data_start + end != size) __builtin_trap();  // a header accepted must match the length
  } catch (const weft::Error&) {}
  return 0;
}
