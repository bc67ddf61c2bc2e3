// Durable files for checkpoints: writes that reach the disk before they count, renames that are
// atomic and durable, and file digests (size and XXH3-64, from the xxHash library).
//
// POSIX guarantees that rename(2) within one file system replaces the target atomically; it is
// durable only once the directory that holds the name is fsynced. So every step of a save is
//   write the bytes -> fsync the file -> rename -> fsync the directory
// and a reader sees either the old state or the new one, never a half-written file under a final
// name. Every failure is a weft::Error naming the path and the system's reason.
//
// Crash testing: each durable step calls point(name) first. A test installs a hook (set_point_hook)
// that kills its process at the k-th point, to check that a save cut anywhere leaves the previous
// checkpoint usable (tests/checkpoint/crash.cpp). Without a hook, point() does nothing.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/xxhash.hpp"

namespace weft::checkpoint {

// A file's length and its XXH3-64 hash.
struct Digest {
  std::uint64_t bytes = 0, xxh3 = 0;
  bool operator==(const Digest&) const = default;
};

inline std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Test hook: called with the name of each durable step of a save, before it is taken.
using PointHook = void (*)(const char* point);
inline std::atomic<PointHook>& point_hook() {
  static std::atomic<PointHook> hook{nullptr};
  return hook;
}
inline void set_point_hook(PointHook h) { point_hook().store(h); }
inline void point(const char* name) {
  if (const PointHook h = point_hook().load()) h(name);
}

namespace detail {

[[noreturn]] inline void sys_fail(const std::string& where, const std::string& what, int err) {
  throw Error(where, cat(what, " (", std::strerror(err), ")"),
              "check the path, its permissions and the free disk space");
}

class Fd {
 public:
  Fd(const std::string& path, int flags, mode_t mode = 0644)
      : path_(path), fd_(::open(path.c_str(), flags | O_CLOEXEC, mode)) {
    if (fd_ < 0) sys_fail(cat("checkpoint(", path, ")"), "cannot open", errno);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  void write_all(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) sys_fail(cat("checkpoint(", path_, ")"), cat("writing ", n, " bytes failed"), errno);
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  void read_all_at(void* data, std::size_t n, std::uint64_t offset) const {
    char* p = static_cast<char*>(data);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) sys_fail(cat("checkpoint(", path_, ")"), cat("reading ", n, " bytes at ", offset, " failed"), errno);
      if (r == 0)
        throw Error(cat("checkpoint(", path_, ")"), cat("the file ends before byte ", offset + n),
                    "the file was truncated after it was verified; save again");
      p += r;
      n -= static_cast<std::size_t>(r);
      offset += static_cast<std::uint64_t>(r);
    }
  }
  void sync() {
    if (::fsync(fd_) != 0) sys_fail(cat("checkpoint(", path_, ")"), "fsync failed", errno);
  }
  void close() {
    if (fd_ >= 0 && ::close(fd_) != 0) {
      fd_ = -1;
      sys_fail(cat("checkpoint(", path_, ")"), "close failed", errno);
    }
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_;
};

}  // namespace detail

// Makes a directory's entries (created, renamed or removed names) durable.
inline void sync_directory(const std::string& dir) {
  detail::Fd d(dir, O_RDONLY | O_DIRECTORY);
  d.sync();
}

// A file written in order, hashed as it goes; finish() fsyncs it and returns its digest.
class SyncedFile {
 public:
  explicit SyncedFile(const std::string& path) : f_(path, O_WRONLY | O_CREAT | O_TRUNC), st_(XXH3_createState()) {
    XXH3_64bits_reset(st_);
  }
  SyncedFile(const SyncedFile&) = delete;
  SyncedFile& operator=(const SyncedFile&) = delete;
  ~SyncedFile() { XXH3_freeState(st_); }
  void write(std::span<const std::byte> p) {
    point("file bytes");
    f_.write_all(p.data(), p.size());
    XXH3_64bits_update(st_, p.data(), p.size());
    d_.bytes += p.size();
  }
  Digest finish() {
    d_.xxh3 = XXH3_64bits_digest(st_);
    point("file fsync");
    f_.sync();
    f_.close();
    return d_;
  }

 private:
  detail::Fd f_;
  XXH3_state_t* st_;
  Digest d_;
};

// Writes a file from pieces, fsyncs it, and returns its digest (hashed from the bytes written).
inline Digest write_synced(const std::string& path, std::span<const std::span<const std::byte>> pieces) {
  SyncedFile f(path);
  for (const auto& p : pieces) f.write(p);
  return f.finish();
}

// A small text file written atomically: path.tmp, fsync, rename, fsync of the directory.
inline void write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()), text.size());
  write_synced(tmp, std::span<const std::span<const std::byte>>(&bytes, 1));
  point("text written");
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    detail::sys_fail(cat("checkpoint(", path, ")"), cat("cannot rename ", tmp), errno);
  sync_directory(std::filesystem::path(path).parent_path().string());
}

// The digest of a whole file, read in 4 MiB blocks.
inline Digest digest_file(const std::string& path) {
  detail::Fd f(path, O_RDONLY);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(4 << 20);
  Digest d;
  for (;;) {
    const ssize_t r = ::read(f.get(), buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      XXH3_freeState(st);
      detail::sys_fail(cat("checkpoint(", path, ")"), "reading failed", errno);
    }
    if (r == 0) break;
    XXH3_64bits_update(st, buf.data(), static_cast<std::size_t>(r));
    d.bytes += static_cast<std::uint64_t>(r);
  }
  d.xxh3 = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return d;
}

}  // namespace weft::checkpoint
