// Token files in llm.c's format: a header of 256 int32 (magic 20240520, version 1, token count,
// the rest zero), then `count` uint16 tokens, little-endian.
//
// The file is memory-mapped and validated when opened, before anything else reads it: the size
// holds the header, the magic and version match, the count matches the size exactly, and every
// token is below the vocabulary, and the reserved header words (3 to 255) are zero, as llm.c writes
// them. A directory, a FIFO or a device is refused before it is opened. Each failure is a
// weft::Error naming the file, what was expected and what was found.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/files.hpp"

namespace weft::data {

inline constexpr std::int32_t kTokenFileMagic = 20240520;
inline constexpr std::int32_t kTokenFileVersion = 1;
inline constexpr std::size_t kTokenFileHeader = 256 * sizeof(std::int32_t);

class TokenFile {
 public:
  // Opens and validates `path` for a vocabulary of `vocab` tokens.
  TokenFile(const std::string& path, std::int64_t vocab) : path_(path) {
    const std::string where = cat("TokenFile(", path, ")");
    (void)require_regular_file(path, where, "an llm.c token file (.bin)");
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);  // never waits, even if the path became a FIFO
    if (fd_ < 0) throw Error(where, cat("cannot open the file: ", std::strerror(errno)), "check the path");
    struct stat st{};
    if (::fstat(fd_, &st) != 0) fail(where, cat("cannot stat the file: ", std::strerror(errno)), "check the file");
    if (!S_ISREG(st.st_mode))
      fail(where, cat("the path is ", file_kind(st), ", not a regular file"), "give a token file");
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ < kTokenFileHeader)
      fail(where, cat("the file has ", size_, " bytes, fewer than the ", kTokenFileHeader, "-byte header"),
           "the file is truncated or not an llm.c token file");
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) fail(where, cat("cannot map the file: ", std::strerror(errno)), "check the file");
    map_ = p;
    std::int32_t header[256];
    std::memcpy(header, map_, sizeof header);
    if (header[0] != kTokenFileMagic)
      fail(where, cat("magic number ", header[0], ", expected ", kTokenFileMagic),
           "this is not an llm.c token file (.bin)");
    if (header[1] != kTokenFileVersion)
      fail(where, cat("version ", header[1], ", expected ", kTokenFileVersion), "write the file in version 1");
    if (header[2] < 0) fail(where, cat("token count ", header[2], " is negative"), "the header is corrupt");
    for (int w = 3; w < 256; ++w)
      if (header[w] != 0)
        fail(where, cat("reserved header word ", w, " is ", header[w], ", not 0"),
             "the header is corrupt, or the file is of a later format version");
    const std::size_t expect = kTokenFileHeader + 2 * static_cast<std::size_t>(header[2]);
    if (expect != size_)
      fail(where,
           cat("the header counts ", header[2], " tokens (", expect, " bytes with the header) but the file has ", size_,
               " bytes"),
           expect > size_ ? "the file is truncated" : "the file has trailing bytes; rewrite it");
    count_ = header[2];
    tokens_ = reinterpret_cast<const std::uint16_t*>(static_cast<const char*>(map_) + kTokenFileHeader);
    for (std::int64_t i = 0; i < count_; ++i)
      if (tokens_[i] >= vocab)
        fail(where, cat("token ", tokens_[i], " at position ", i, " is not below the vocabulary size ", vocab),
             "use a model vocabulary at least as large as the tokenizer's");
  }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile() { close(); }

  std::int64_t size() const { return count_; }
  std::span<const std::uint16_t> tokens() const { return {tokens_, static_cast<std::size_t>(count_)}; }
  const std::string& path() const { return path_; }

  // Writes tokens in the format (for tools and tests).
  static void write(const std::string& path, std::span<const std::uint16_t> tokens) {
    std::vector<std::int32_t> header(256, 0);
    header[0] = kTokenFileMagic;
    header[1] = kTokenFileVersion;
    header[2] = static_cast<std::int32_t>(tokens.size());
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw Error(cat("TokenFile::write(", path, ")"), "cannot create the file", "check the directory");
    const bool ok = std::fwrite(header.data(), 4, 256, f) == 256 &&
                    std::fwrite(tokens.data(), 2, tokens.size(), f) == tokens.size();
    if (std::fclose(f) != 0 || !ok)
      throw Error(cat("TokenFile::write(", path, ")"), "writing failed", "check the disk space");
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& what, const std::string& fix) {
    close();
    throw Error(where, what, fix);
  }
  void close() {
    if (map_) ::munmap(map_, size_);
    if (fd_ >= 0) ::close(fd_);
    map_ = nullptr;
    fd_ = -1;
  }

  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  std::int64_t count_ = 0;
  const std::uint16_t* tokens_ = nullptr;
};

}  // namespace weft::data
