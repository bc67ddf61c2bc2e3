// Importing another library's model directory as a weft checkpoint (a family's import_hf,
// import_diffusers): reading its safetensors, and writing the weft tensors made from them.
//
//   checkpoint::ImportDir d(dir, "model", at)   <stem>.safetensors, or the files that
//                                               <stem>.safetensors.index.json names
//   d.find(name), d.names(), d.read(name)       a tensor's header, every name, its values in double
//   checkpoint::write_imported(out, tensors, record, seed, dir, at)
//                                               a consolidated f64 checkpoint of step 0 at `out`:
//                                               each ImportedTensor's values made by its fill when
//                                               the file reaches it (one tensor in memory at a
//                                               time), the model's record in the manifest, loaded
//                                               with checkpoint::load(out, model, dp, mesh,
//                                               {.optimizer = false}) into any mesh
//
// defines: checkpoint::ImportDir, checkpoint::ImportedTensor, checkpoint::write_imported
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "weft/checkpoint/checkpoint.hpp"
#include "weft/core/files.hpp"
#include "weft/core/json_limits.hpp"

namespace weft::checkpoint {

class ImportDir {
 public:
  ImportDir(const std::string& dir, const std::string& stem, std::string at) : at_(std::move(at)) {
    const auto single = std::filesystem::path(dir) / (stem + ".safetensors");
    const auto index = std::filesystem::path(dir) / (stem + ".safetensors.index.json");
    std::vector<std::string> files;
    if (std::filesystem::is_regular_file(index)) {
      const std::string where = cat(at_, ": ", index.string());
      const std::string text = read_text_file(index.string(), 1 << 24, where);
      check_json_limits(text, {.max_bytes = 1 << 24, .max_depth = 16}, where);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        throw Error(where, cat("is not valid JSON (", brief(e.what(), 200), ")"), "pass the library's index file");
      }
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        throw Error(where, "has no weight_map object", "pass the library's index file");
      std::set<std::string> seen;
      for (const auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
          throw Error(where, cat("maps ", brief(name), " to ", brief(file.dump())),
                      "name a file in the same directory");
        if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
      }
    } else if (std::filesystem::is_regular_file(single)) {
      files.push_back(stem + ".safetensors");
    } else {
      throw Error(at_, cat("has neither ", stem, ".safetensors nor ", stem, ".safetensors.index.json"),
                  "pass a directory that the library's save_pretrained wrote");
    }
    for (const auto& f : files) {
      const std::string path = (std::filesystem::path(dir) / f).string();
      headers_.push_back({path, read_header(path)});
      for (const auto& t : headers_.back().second.tensors)
        if (!where_.emplace(t.name, headers_.size() - 1).second)
          throw Error(at_, cat("has the tensor ", brief(t.name), " in two files"), "pass a consistent checkpoint");
    }
  }
  const TensorInfo* find(const std::string& name) const {
    const auto it = where_.find(name);
    return it == where_.end() ? nullptr : headers_[it->second].second.find(name);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, f] : where_) out.push_back(n);
    return out;
  }
  std::vector<double> read(const std::string& name) const {
    const auto it = where_.find(name);
    if (it == where_.end()) throw Error(at_, cat("has no tensor ", brief(name)), "pass the whole model");
    const auto& [path, h] = headers_[it->second];
    const TensorInfo* t = h.find(name);
    detail::Fd fd(path, O_RDONLY);
    const std::size_t bytes = t->end - t->begin, es = size_of(t->dtype);
    std::vector<std::byte> raw(bytes);
    fd.read_all_at(raw.data(), raw.size(), h.data_start + t->begin);
    std::vector<double> v(bytes / es);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = detail::convert_element<double>(t->dtype, raw.data() + i * es);
    return v;
  }
  const std::string& at() const { return at_; }

 private:
  std::string at_;
  std::vector<std::pair<std::string, Header>> headers_;
  std::map<std::string, std::size_t> where_;
};

// One weft parameter of an import: its name (without "param/"), global shape, and what fills its
// values (resized to the shape's count, row-major) from the source.
struct ImportedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::function<void(std::vector<double>&)> fill;
};

inline void write_imported(const std::string& out, const std::vector<ImportedTensor>& tensors,
                           const std::vector<std::pair<std::string, std::int64_t>>& record, std::uint64_t seed,
                           const std::string& from, const std::string& at) {
  std::vector<detail::Staged> staged;
  for (const auto& t : tensors) {
    std::int64_t count = 1;
    for (std::int64_t d : t.shape) count *= d;
    staged.push_back({"param/" + t.name,
                      DType::f64,
                      t.shape,
                      t.shape,
                      std::vector<std::int64_t>(t.shape.size(), 0),
                      t.shape,
                      "imported",
                      0,
                      count,
                      {}});
  }
  std::vector<double> w;
  auto bytes_of = [&](std::size_t i, std::uint64_t) {
    const auto& shape = staged[i].global;
    std::int64_t count = 1;
    for (std::int64_t d : shape) count *= d;
    try {
      w.assign(static_cast<std::size_t>(count), 0.0);
      tensors[i].fill(w);
    } catch (const std::bad_alloc&) {  // said, with what and how much, never a bare std::bad_alloc
      throw Error(at,
                  cat("ran out of memory converting ", tensors[i].name, " (", count, " values, ", 2 * 8 * count,
                      " bytes in double with its source)"),
                  "convert on a machine with more memory");
    }
    return std::as_bytes(std::span<const double>(w));
  };
  std::filesystem::create_directories(out);
  Manifest m;
  m.policy = "consolidated";
  for (const auto& [k, v] : record) m.model[k] = v;
  m.optimizer = {{"rule", "none"}, {"steps", 0}, {"skipped", 0}};
  m.run = {{"step", 0}, {"loader_position", 0}, {"seed", seed}, {"imported_from", from}};
  m.strategy = "imported";
  m.precision = "f64";
  m.add_file({"model.safetensors", detail::write_staged(cat(out, "/model.safetensors"), staged, bytes_of)});
  add_pieces(m, out, "model.safetensors");
  write_atomic(cat(out, "/manifest.json"), to_json(m).dump(1));
}

}  // namespace weft::checkpoint
