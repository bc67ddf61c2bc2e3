// defines: checkpoint::ExportDir, the directory a Hugging Face export writes into, and
// checkpoint::ExportOptions, what weft-export asks of a family's export (Family::export_hf).
//
// An export never loses data:
// - it never writes into the checkpoint it reads: the directory may not be the step directory, the
//   run directory that holds its `latest`, or anything inside them;
// - it never deletes or replaces a file it did not write: the directory must be new, empty, or an
//   earlier export's, which its `weft_export.json` says (the files that export wrote); the files of
//   an earlier export that this one does not write again are removed, nothing else;
// - every file goes to `<name>.tmp` first, fsynced, then renamed over its name, so a full disk or a
//   kill leaves the earlier export's file whole, never a truncated one under the final name; a
//   failed export removes its .tmp files.
//
//   ExportDir d(out, checkpoint);            // refuses as above, naming the path and what is there
//   d.write("model.safetensors", [&](const std::string& tmp) { checkpoint::write(tmp, ...); });
//   d.write_text("config.json", text);
//   d.commit();                              // the earlier export's leftovers go, weft_export.json is written
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "weft/checkpoint/common.hpp"
#include "weft/checkpoint/files.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/core/files.hpp"
#include "weft/core/json_limits.hpp"

namespace weft::checkpoint {

// weft-export's choices of the exported weights, each unset where not given: the element type
// (--dtype) and the largest weights file, past which the export is sharded (--max-shard-bytes). A
// family's export refuses a choice it does not offer, naming it.
struct ExportOptions {
  std::optional<DType> dtype;
  std::optional<std::uint64_t> max_shard_bytes;
};

// Refuses `path` (a directory, or a file's) when it is inside the checkpoint `checkpoint` names: what
// it names, the step directory it resolves to, or the run directory holding that step's `latest`.
inline void refuse_inside(const std::string& path, const std::string& checkpoint, const std::string& where) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path step = fs::weakly_canonical(resolve(checkpoint), ec);
  std::vector<fs::path> guarded{fs::weakly_canonical(checkpoint, ec), step};
  if (fs::exists(step.parent_path() / "latest", ec)) guarded.push_back(step.parent_path());
  const fs::path target = fs::weakly_canonical(path.empty() ? "." : path, ec);
  for (const fs::path& g : guarded) {
    const fs::path rel = target.lexically_relative(g);
    if (!rel.empty() && *rel.begin() != "..")
      throw Error(where, cat("is inside the checkpoint it exports (", g.string(), ")"),
                  "write to a directory outside the checkpoint's run directory");
  }
}

class ExportDir {
 public:
  static constexpr const char* kRecord = "weft_export.json";

  ExportDir(const std::string& dir, const std::string& checkpoint) : dir_(dir.empty() ? "." : dir) {
    namespace fs = std::filesystem;
    const std::string where = cat("export(", dir_, ")");
    std::error_code ec;
    refuse_inside(dir_, checkpoint, where);
    if (fs::exists(dir_, ec) && !fs::is_directory(dir_, ec))
      throw Error(where, "exists and is not a directory", "give a new or empty directory");
    fs::create_directories(dir_, ec);
    if (ec) detail::sys_fail(where, "cannot create the directory", ec.value());
    // What is there: nothing, or an earlier export's files (and whatever the user put beside them).
    std::vector<std::string> present;
    for (const auto& e : fs::directory_iterator(dir_, ec)) present.push_back(e.path().filename().string());
    if (ec) detail::sys_fail(where, "cannot list the directory", ec.value());
    std::sort(present.begin(), present.end());
    if (present.empty()) return;
    const fs::path record = fs::path(dir_) / kRecord;
    if (!fs::is_regular_file(record, ec)) {
      std::string some;
      for (std::size_t i = 0; i < present.size() && i < 4; ++i) some += cat(i ? ", " : "", brief(present[i]));
      throw Error(where,
                  cat("holds ", present.size(), " files (", some, present.size() > 4 ? ", ..." : "", ") and no ",
                      kRecord, ": not an earlier export, and an export would replace files in it"),
                  "export to a new or empty directory");
    }
    try {
      const auto j = nlohmann::json::parse(read_text_file(record.string(), 1 << 20, where));
      for (const auto& f : j.at("files")) {
        const std::string name = f.get<std::string>();
        if (!detail::plain_file_name(name))
          throw Error(where, cat(kRecord, " names \"", brief(name), "\""), "remove it");
        earlier_.insert(name);
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(where, cat(kRecord, " is not an export's record (", e.what(), ")"),
                  "export to a new or empty directory");
    }
  }
  ExportDir(const ExportDir&) = delete;
  ExportDir& operator=(const ExportDir&) = delete;
  // A failed export removes what it left under .tmp names and the files it added (names no earlier
  // export had); the earlier export's files it had not replaced yet are untouched.
  ~ExportDir() {
    std::error_code ec;
    for (const std::string& t : pending_) std::filesystem::remove(t, ec);
    if (!committed_)
      for (const std::string& n : written_)
        if (!earlier_.contains(n)) std::filesystem::remove(cat(dir_, "/", n), ec);
  }

  const std::string& dir() const { return dir_; }

  // Writes `name` by write(tmp_path) into `<name>.tmp`, then renames it over `name`.
  void write(const std::string& name, const std::function<void(const std::string&)>& write_tmp) {
    if (!detail::plain_file_name(name) || name == kRecord)
      throw Error(cat("export(", dir_, ")"), cat("cannot write a file named \"", brief(name), "\""),
                  "name a plain file");
    const std::string path = cat(dir_, "/", name), tmp = path + ".tmp";
    if (!earlier_.contains(name) && std::filesystem::exists(std::filesystem::symlink_status(path)))
      throw Error(cat("export(", dir_, ")"), cat("already holds ", name, ", which no earlier export wrote"),
                  "move it away, or export to a new directory");
    pending_.push_back(tmp);
    write_tmp(tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      detail::sys_fail(cat("export(", path, ")"), cat("cannot rename ", tmp), errno);
    pending_.pop_back();
    written_.push_back(name);
  }
  void write_text(const std::string& name, const std::string& text) {
    write(name, [&](const std::string& tmp) {
      const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()), text.size());
      write_synced(tmp, std::span<const std::span<const std::byte>>(&bytes, 1));
    });
  }

  // The earlier export's files that this one did not write again are removed, and the record of
  // this one's is written (it, too, through a .tmp and a rename).
  void commit() {
    std::error_code ec;
    for (const std::string& old : earlier_)
      if (std::find(written_.begin(), written_.end(), old) == written_.end())
        std::filesystem::remove(cat(dir_, "/", old), ec);
    write_atomic(cat(dir_, "/", kRecord), nlohmann::json{{"files", written_}}.dump(2) + "\n");
    sync_directory(dir_);
    committed_ = true;
  }

 private:
  std::string dir_;
  std::set<std::string> earlier_;
  std::vector<std::string> written_, pending_;
  bool committed_ = false;
};

}  // namespace weft::checkpoint
