// libFuzzer target: the checkpoint manifest parser and, for manifests whose pieces are small, the
// coverage check. Every input is parsed or refused with a weft::Error; anything else is a bug.
#include <cstdint>
#include <string>

#include "weft/checkpoint/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto m = weft::checkpoint::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    // The coverage check's work is linear in the pieces' elements, which load() bounds by the
    // verified file sizes; here the declared sizes bound them, so cap them to keep runs fast.
    std::uint64_t bytes = 0;
    for (const auto& f : m.files()) bytes += f.digest.bytes;
    if (bytes <= (1u << 20)) weft::checkpoint::check_coverage(m, "fuzz");
  } catch (const weft::Error&) {}
  return 0;
}
