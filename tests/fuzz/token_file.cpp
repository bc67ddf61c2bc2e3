// libFuzzer target: the llm.c token file reader (header, count, tokens against the vocabulary) on
// arbitrary bytes written to a file. Every input opens or is refused with a weft::Error.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "weft/data/token_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/weft_fuzz_token_file_" + std::to_string(::getpid()) + ".bin";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const weft::data::TokenFile t(path, 50257);
    // an accepted file's count matches its length
    if (static_cast<std::size_t>(t.size()) * 2 + 1024 != size) __builtin_trap();
  } catch (const weft::Error&) {}
  return 0;
}
