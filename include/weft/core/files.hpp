// What a path names, checked before a file is opened: opening a FIFO with no writer waits forever,
// and a directory or a device is not data. Plain C++ and POSIX.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "weft/core/error.hpp"

namespace weft {

// "a directory", "a FIFO (named pipe)", ...: what `st` describes, for messages.
inline const char* file_kind(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "a regular file";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

// Throws Error(where, ...) unless `path` names an existing regular file (after symlinks); returns
// its size in bytes. `what` says what the file should hold ("an llm.c token file").
inline std::size_t require_regular_file(const std::string& path, const std::string& where, const std::string& what) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(where, cat("cannot read '", path, "': ", std::strerror(errno)), cat("give the path of ", what));
  if (!S_ISREG(st.st_mode))
    throw Error(where, cat("'", path, "' is ", file_kind(st), ", not a regular file"),
                cat("give the path of ", what,
                    S_ISFIFO(st.st_mode) ? " (a FIFO is not read: it could wait forever for a writer)" : ""));
  return static_cast<std::size_t>(st.st_size);
}

// The text of the regular file at `path`, refused (Error(where, ...)) when it is not one or holds
// more than `max_bytes`.
inline std::string read_text_file(const std::string& path, std::size_t max_bytes, const std::string& where) {
  const std::size_t n = require_regular_file(path, where, "a text file");
  if (n > max_bytes)
    throw Error(where, cat("'", path, "' is ", n, " bytes, over the limit of ", max_bytes), "pass a smaller file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error(where, cat("cannot open '", path, "': ", std::strerror(errno)), "check its permissions");
  std::string text(n, '\0');
  const std::size_t got = n ? std::fread(text.data(), 1, n, f) : 0;
  std::fclose(f);
  if (got != n) throw Error(where, cat("read ", got, " of the ", n, " bytes of '", path, "'"), "check the file");
  return text;
}

}  // namespace weft
