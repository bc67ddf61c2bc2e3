// Files for tests that write, damage and read back data files (tests/data/): a path in the
// temporary directory unique to this process, and a file's bytes whole.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace test {

inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("weft-test-" + std::to_string(::getpid()) + "-" + name)).string();
}

inline std::vector<char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

inline void write_all(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace test
