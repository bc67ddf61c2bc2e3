// --init-from's temporary directory: a Hugging Face file converted to a weft checkpoint of step 0,
// removed on every way out of the run, and by the next run when a killed process left it.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "weft/core/error.hpp"

namespace weft::train {

// A temporary directory, removed with everything in it when the object goes. Named
// weft_init_<pid>_XXXXXX under the temporary directory (TMPDIR, else /tmp), so that the next run
// can tell one a killed process left (remove_stale_init_dirs).
struct TempDir {
  std::string path;
  TempDir() = default;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir(TempDir&& o) noexcept : path(std::exchange(o.path, {})) {}
  TempDir& operator=(TempDir&& o) noexcept {
    if (this != &o) {
      remove();
      path = std::exchange(o.path, {});
    }
    return *this;
  }
  ~TempDir() { remove(); }
  void remove() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
    path.clear();
  }
  static TempDir make(const std::string& where) {
    std::error_code ec;
    const auto base = std::filesystem::temp_directory_path(ec);
    std::string tmpl =
        ((ec ? std::filesystem::path("/tmp") : base) / cat("weft_init_", ::getpid(), "_XXXXXX")).string();
    if (!::mkdtemp(tmpl.data()))
      throw Error(where, cat("cannot create a temporary directory like ", tmpl, " (", std::strerror(errno), ")"),
                  "set TMPDIR to a writable directory with room for the model");
    TempDir t;
    t.path = tmpl;
    return t;
  }
};

// Removes the weft_init_<pid>_* directories of processes that are gone (a run killed while it held
// its --init-from copy); returns how many.
inline int remove_stale_init_dirs() {
  std::error_code ec;
  const auto base = std::filesystem::temp_directory_path(ec);
  if (ec) return 0;
  int removed = 0;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    const std::string n = e.path().filename().string();
    if (!n.starts_with("weft_init_") || !e.is_directory() || e.is_symlink()) continue;
    const std::string pid = n.substr(10, n.find('_', 10) - 10);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::error_code rm;
    std::filesystem::remove_all(e.path(), rm);
    removed += rm ? 0 : 1;
  }
  return removed;
}

}  // namespace weft::train
