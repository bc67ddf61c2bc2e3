// One trainer per save directory: an advisory lock (flock(2)) on the directory <root> itself, held by
// the process that publishes checkpoints (world rank 0's) for as long as it may save; <root>/.weft.lock
// names the holder.
//
// Two trainers saving into one directory would prune each other's checkpoints and move `latest`
// under each other's feet; neither could notice from the files alone. So the saver takes the lock
// before its first save, and a trainer takes it at start-up (before the first step: a directory it
// cannot write is refused then too, since the lock file is created). A second process is refused
// with the holder's pid and host, which the lock file records. The lock goes with the process: a
// killed trainer holds nothing (the kernel drops flock locks with the last descriptor), and the
// file left behind is harmless. Within one process the lock is counted (thread ranks, a trainer and
// its Saver share it).
//
// flock is advisory and, on some network file systems, local to a machine: it guards against the
// common mistake (a second run pointed at the same --save-dir), not against a hostile writer.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include "weft/core/error.hpp"

namespace weft::checkpoint {

class DirectoryLock {
 public:
  DirectoryLock() = default;
  // Takes the lock of directory `root` (created when missing), or throws Error naming the holder.
  explicit DirectoryLock(const std::string& root) : key_(key_of(root)) {
    std::lock_guard guard(registry_mutex());
    auto& held = registry()[key_];
    if (held.count == 0) held.fd = acquire(root);
    ++held.count;
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  DirectoryLock(DirectoryLock&& o) noexcept : key_(std::move(o.key_)) { o.key_.clear(); }
  DirectoryLock& operator=(DirectoryLock&& o) noexcept {
    if (this != &o) {
      release();
      key_ = std::move(o.key_);
      o.key_.clear();
    }
    return *this;
  }
  ~DirectoryLock() { release(); }

  bool held() const { return !key_.empty(); }

  static std::string file_of(const std::string& root) { return (std::filesystem::path(root) / ".weft.lock").string(); }

 private:
  struct Held {
    int fd = -1;
    int count = 0;
  };
  static std::mutex& registry_mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::string, Held>& registry() {
    static std::map<std::string, Held> r;
    return r;
  }
  static std::string key_of(const std::string& root) {
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    const auto canonical = std::filesystem::weakly_canonical(root, ec);
    return ec ? root : canonical.string();
  }

  static int acquire(const std::string& root) {
    const std::string where = cat("checkpoint(", root, ")");
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec || !std::filesystem::is_directory(root))
      throw Error(where, cat("cannot create the directory", ec ? cat(" (", ec.message(), ")") : ""),
                  "give a save directory that can be created and written");
    // The lock is on the directory itself, which cannot go while it holds checkpoints: a lock on
    // .weft.lock alone was lost when someone deleted the file, and a second trainer locked a new
    // one. .weft.lock records the holder for the refusal's message; it is opened first (without
    // truncating a holder's record) so that a directory that cannot be written is refused as such.
    const std::string path = file_of(root);
    const int lf = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (lf < 0)
      throw Error(where, cat("cannot create its lock file .weft.lock (", std::strerror(errno), ")"),
                  "give a save directory this process can write");
    const int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(lf);
      if (fd >= 0) ::close(fd);
      std::string who = "another process";
      if (const int rf = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW); rf >= 0) {
        char holder[256] = {};
        if (const ssize_t n = ::pread(rf, holder, sizeof holder - 1, 0); n > 0)
          who.assign(holder, static_cast<std::size_t>(n));
        ::close(rf);
      }
      while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
      if (err == EWOULDBLOCK)
        throw Error(where, cat("is in use by another trainer (", who, ")"),
                    "give each run its own --save-dir, or stop the other run first");
      throw Error(where, cat("cannot lock the directory (", std::strerror(err), ")"),
                  "give a save directory on a local file system");
    }
    char host[128] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string me = cat("pid ", ::getpid(), " on ", host, "\n");
    const bool wrote =
        ::ftruncate(lf, 0) == 0 && ::pwrite(lf, me.data(), me.size(), 0) == static_cast<ssize_t>(me.size());
    const int err = errno;
    ::close(lf);
    if (!wrote) {
      ::close(fd);
      throw Error(where, cat("cannot write its lock file .weft.lock (", std::strerror(err), ")"),
                  "give a save directory this process can write, on a device with free space");
    }
    return fd;
  }

  void release() {
    if (key_.empty()) return;
    std::lock_guard guard(registry_mutex());
    auto it = registry().find(key_);
    if (it != registry().end() && --it->second.count == 0) {
      ::close(it->second.fd);  // drops the flock
      registry().erase(it);
    }
    key_.clear();
  }

  std::string key_;
};

}  // namespace weft::checkpoint
