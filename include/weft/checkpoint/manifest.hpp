// The manifest of a checkpoint (manifest.json, written last): what was saved, how it was laid out,
// and how to check it.
//
//   {
//     "format": "weft-checkpoint", "version": 1, "policy": "sharded",
//     "step": 10,                                   training steps done
//     "mesh": {"data": 2, "tensor": 2, "pipe": 1}, "strategy": "DataLayout<...>", "precision": "f32",
//     "model": {...},                               the model's configuration
//     "optimizer": {"rule": "adamw", "steps": 10, "skipped": 0},
//     "run": {"loader_position": 10, "seed": 1, ...},   the trainer's state (schedule, data, RNG)
//     "files": [{"name": "rank_00000.safetensors", "bytes": 1234, "xxh3": "0123456789abcdef"}, ...],
//     "tensors": {
//       "param/h0.attn.qkv.weight": {"dtype": "F32", "global": [96, 32], "logical": [96, 32],
//                                    "layout": "Layout<...>",
//         "pieces": [{"file": "rank_00000.safetensors", "key": "param/h0.attn.qkv.weight",
//                     "box_offset": [0, 0], "box_extent": [48, 32], "first": 0, "count": 768}, ...]}}
//   }
//
// A tensor's name is "<kind>/<parameter>", kind one of param (the values in the compute type),
// master (f32 master weights under mixed precision) and the update rule's state names (exp_avg,
// exp_avg_sq; momentum_buffer). A piece is a contiguous range [first, first + count) of the
// row-major order of a box of the global tensor (a tensor-parallel shard), stored as a 1-D tensor
// `key` of a file: the data-parallel slices of a unit's flat buffer cut a shard at any element.
//
// parse() checks every field's type and range and returns a weft::Error naming the manifest and the
// field; check_coverage() checks that the pieces of every tensor cover its global shape exactly once.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "weft/checkpoint/files.hpp"
#include "weft/checkpoint/safetensors.hpp"
#include "weft/core/error.hpp"
#include "weft/core/json_limits.hpp"

namespace weft::checkpoint {

inline constexpr int kFormatVersion = 1;

struct PieceRecord {
  std::string file, key;
  std::vector<std::int64_t> box_offset, box_extent;
  std::int64_t first = 0, count = 0;
};

struct TensorRecord {
  DType dtype = DType::f32;
  std::vector<std::int64_t> global, logical;
  std::string layout;
  std::vector<PieceRecord> pieces;
};

struct FileRecord {
  std::string name;
  Digest digest;
};

// The largest manifest read (its size is checked before it is read), and the deepest nesting in it:
// a manifest of GPT-2 1.5B saved by 4096 ranks is under 100 MB, with 6 levels (tensors, a tensor,
// its pieces, a piece, a box) plus what a trainer nests in run.extra.
inline constexpr std::uint64_t kMaxManifest = 256ull << 20;
inline constexpr JsonLimits kManifestLimits{.max_bytes = kMaxManifest, .max_depth = 32};
// The largest step, optimizer step count and data position accepted: 2^53, below which a double
// (the schedules' arithmetic) holds every integer.
inline constexpr std::int64_t kMaxStep = std::int64_t{1} << 53;

struct Manifest {
  std::string policy = "sharded";
  std::int64_t step = 0;
  int data = 1, tensor = 1, pipe = 1;
  int context = 1;  // written where > 1 (context parallelism: parameters whole on it, sliced over data x context)
  std::string strategy, precision;
  // the model family that saved it ("gpt2", "llama"); empty in checkpoints from before weft recorded it
  std::string family;
  nlohmann::json model = nlohmann::json::object(), optimizer = nlohmann::json::object(), run = nlohmann::json::object();
  std::map<std::string, TensorRecord> tensors;

  const std::vector<FileRecord>& files() const { return files_; }
  // Adds a file; false (and nothing added) when one of that name is listed already.
  bool add_file(FileRecord f) {
    if (!file_at_.emplace(f.name, files_.size()).second) return false;
    files_.push_back(std::move(f));
    return true;
  }
  const FileRecord* file(const std::string& name) const {
    const auto it = file_at_.find(name);
    return it == file_at_.end() ? nullptr : &files_[it->second];
  }
  // The position of a listed file in files(), or files().size() for one not listed.
  std::size_t file_index(const std::string& name) const {
    const auto it = file_at_.find(name);
    return it == file_at_.end() ? files_.size() : it->second;
  }

 private:
  std::vector<FileRecord> files_;
  std::unordered_map<std::string, std::size_t> file_at_;
};

inline nlohmann::json to_json(const Manifest& m) {
  nlohmann::json j{{"format", "weft-checkpoint"},
                   {"version", kFormatVersion},
                   {"policy", m.policy},
                   {"step", m.step},
                   {"mesh", {{"data", m.data}, {"tensor", m.tensor}, {"pipe", m.pipe}}},
                   {"strategy", m.strategy},
                   {"precision", m.precision},
                   {"model", m.model},
                   {"optimizer", m.optimizer},
                   {"run", m.run}};
  if (m.context > 1) j["mesh"]["context"] = m.context;
  if (!m.family.empty()) j["family"] = m.family;
  j["files"] = nlohmann::json::array();
  for (const FileRecord& f : m.files())
    j["files"].push_back({{"name", f.name}, {"bytes", f.digest.bytes}, {"xxh3", hex64(f.digest.xxh3)}});
  j["tensors"] = nlohmann::json::object();
  for (const auto& [name, t] : m.tensors) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const PieceRecord& p : t.pieces)
      pieces.push_back({{"file", p.file},
                        {"key", p.key},
                        {"box_offset", p.box_offset},
                        {"box_extent", p.box_extent},
                        {"first", p.first},
                        {"count", p.count}});
    j["tensors"][name] = {{"dtype", safetensors_dtype(t.dtype)},
                          {"global", t.global},
                          {"logical", t.logical},
                          {"layout", t.layout},
                          {"pieces", pieces}};
  }
  return j;
}

namespace detail {

// Checked product of non-negative extents; false on overflow past 2^62.
inline bool product(const std::vector<std::int64_t>& dims, std::int64_t& out) {
  out = 1;
  for (std::int64_t d : dims) {
    if (d < 0) return false;
    if (d != 0 && out > (std::int64_t{1} << 62) / d) return false;
    out *= d;
  }
  return true;
}

// A file name that stays inside the checkpoint's directory.
inline bool plain_file_name(const std::string& n) {
  if (n.empty() || n.size() > 255 || n == "." || n == "..") return false;
  return std::none_of(n.begin(), n.end(), [](char c) { return c == '/' || c == '\\' || c == '\0'; });
}

}  // namespace detail

// Parses and validates a manifest's text; `where` names it in errors.
namespace detail {
// j as T (an integer type, or a vector of int64), after `check` has accepted each integer.
template <class T, class Check>
T whole_of(const nlohmann::json& j, Check&& check) {
  if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    if (!j.is_array()) return j.get<T>();  // nlohmann's own type error
    T out;
    for (const auto& e : j) out.push_back(check(e).template get<std::int64_t>());
    return out;
  } else {
    return check(j).template get<T>();
  }
}
}  // namespace detail

inline Manifest parse(const std::string& text, const std::string& where) {
  const std::string at = cat("manifest(", where, ")");
  auto bad = [&](const std::string& what) -> void {
    throw Error(at, what, "save the checkpoint again, or resume from an earlier one");
  };
  check_json_limits(text, kManifestLimits, at);  // before the parser: its memory and recursion follow size and depth
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) { bad(cat("is not valid JSON (", e.what(), ")")); }

  // An integer field, or a list of them: a float would convert out of range (undefined), so it is refused.
  auto whole_one = [&](const nlohmann::json& v) -> const nlohmann::json& {
    if (!v.is_number_integer()) bad(cat("has ", brief(v.dump()), " where an integer belongs"));
    return v;
  };
  // An integer field in [lo, hi].
  auto ranged = [&](const nlohmann::json& v, const std::string& name, std::int64_t lo, std::int64_t hi) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) ||
        v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
      bad(cat("has ", name, " ", brief(v.dump()), "; expected an integer in [", lo, ", ", hi, "]"));
    return v.get<std::int64_t>();
  };
  Manifest m;
  try {
    if (!j.is_object() || j.value("format", "") != "weft-checkpoint")
      bad("is not a weft checkpoint manifest (no \"format\": \"weft-checkpoint\")");
    if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != kFormatVersion)
      bad(cat("has version ", j.contains("version") ? brief(j["version"].dump()) : "(none)",
              "; this weft reads version ", kFormatVersion));
    m.policy = j.at("policy").get<std::string>();
    if (m.policy != "sharded" && m.policy != "consolidated")
      bad(cat("has policy \"", brief(m.policy), "\"; expected sharded or consolidated"));
    m.step = detail::whole_of<std::int64_t>(j.at("step"), whole_one);
    if (m.step < 0) bad(cat("has step ", m.step));
    ranged(j.at("step"), "step", 0, kMaxStep);
    const auto& mesh = j.at("mesh");
    m.data = detail::whole_of<int>(mesh.at("data"), whole_one);
    m.tensor = detail::whole_of<int>(mesh.at("tensor"), whole_one);
    m.pipe = detail::whole_of<int>(mesh.at("pipe"), whole_one);
    m.context = mesh.contains("context") ? detail::whole_of<int>(mesh.at("context"), whole_one) : 1;
    if (m.data < 1 || m.tensor < 1 || m.pipe < 1 || m.context < 1)
      bad(cat("has mesh degrees ", brief(mesh.dump()), "; each must be >= 1"));
    m.strategy = j.at("strategy").get<std::string>();
    m.precision = j.at("precision").get<std::string>();
    if (j.contains("family")) {
      if (!j["family"].is_string())
        bad(cat("has family ", brief(j["family"].dump()), "; expected a model family's name"));
      m.family = j["family"].get<std::string>();
    }
    m.model = j.at("model");
    m.optimizer = j.at("optimizer");
    m.run = j.at("run");
    if (!m.model.is_object() || !m.optimizer.is_object() || !m.run.is_object())
      bad("has a model, optimizer or run field that is not an object");
    // The run and optimizer state a resume restores: the step twice (the directory's and the run's),
    // the optimizer's step count and skipped steps, the data position and the seed.
    (void)m.optimizer.at("rule").get<std::string>();
    const std::int64_t steps = ranged(m.optimizer.at("steps"), "optimizer.steps", 0, kMaxStep);
    ranged(m.optimizer.at("skipped"), "optimizer.skipped", 0, steps);
    if (ranged(m.run.at("step"), "run.step", 0, kMaxStep) != m.step)
      bad(cat("has run.step ", m.run.at("step").dump(), " but step ", m.step));
    ranged(m.run.at("loader_position"), "run.loader_position", 0, kMaxStep);
    if (!m.run.at("seed").is_number_unsigned())
      bad(cat("has run.seed ", brief(m.run.at("seed").dump()), "; expected an integer in [0, 2^64)"));
    if (m.run.contains("extra") && !m.run["extra"].is_object()) bad("has a run.extra that is not an object");
    for (const auto& f : j.at("files")) {
      FileRecord r;
      r.name = f.at("name").get<std::string>();
      if (!detail::plain_file_name(r.name)) bad(cat("names a file \"", brief(r.name), "\" outside its directory"));
      r.digest.bytes = detail::whole_of<std::uint64_t>(f.at("bytes"), whole_one);
      const std::string h = f.at("xxh3").get<std::string>();
      if (h.size() != 16 || h.find_first_not_of("0123456789abcdef") != std::string::npos)
        bad(cat("has a malformed xxh3 \"", brief(h, 32), "\" for ", r.name));
      r.digest.xxh3 = std::stoull(h, nullptr, 16);
      const std::string name = r.name;
      if (!m.add_file(std::move(r))) bad(cat("lists the file ", name, " twice"));
    }
    for (const auto& [name, t] : j.at("tensors").items()) {
      TensorRecord r;
      const std::string tname = brief(name);
      const std::string dt = t.at("dtype").get<std::string>();
      bool known = false;
      for (DType d : {DType::f64, DType::f32, DType::bf16})
        if (dt == safetensors_dtype(d)) {
          r.dtype = d;
          known = true;
        }
      if (!known) bad(cat("tensor ", tname, " has dtype \"", brief(dt), "\"; expected F64, F32 or BF16"));
      r.global = detail::whole_of<std::vector<std::int64_t>>(t.at("global"), whole_one);
      r.logical = detail::whole_of<std::vector<std::int64_t>>(t.at("logical"), whole_one);
      r.layout = t.at("layout").get<std::string>();
      std::int64_t n = 0;
      if (r.global.empty() || r.global.size() > kMaxRank || !detail::product(r.global, n))
        bad(cat("tensor ", tname, " has a global shape ", brief(t.at("global").dump()),
                " of no, too many or too large dims"));
      if (r.logical.size() != r.global.size())
        bad(cat("tensor ", tname, " has a logical shape of another rank than its global shape"));
      for (std::size_t d = 0; d < r.global.size(); ++d)
        if (r.logical[d] < 0 || r.logical[d] > r.global[d])
          bad(cat("tensor ", tname, " has a logical shape ", brief(t.at("logical").dump()),
                  " outside its global shape ", brief(t.at("global").dump())));
      for (const auto& p : t.at("pieces")) {
        PieceRecord q;
        q.file = p.at("file").get<std::string>();
        q.key = p.at("key").get<std::string>();
        q.box_offset = detail::whole_of<std::vector<std::int64_t>>(p.at("box_offset"), whole_one);
        q.box_extent = detail::whole_of<std::vector<std::int64_t>>(p.at("box_extent"), whole_one);
        q.first = detail::whole_of<std::int64_t>(p.at("first"), whole_one);
        q.count = detail::whole_of<std::int64_t>(p.at("count"), whole_one);
        if (!m.file(q.file))
          bad(cat("tensor ", tname, " has a piece in ", brief(q.file), ", which is not among the files"));
        if (q.box_offset.size() != r.global.size() || q.box_extent.size() != r.global.size())
          bad(cat("tensor ", tname, " has a piece whose box is not of rank ", r.global.size()));
        for (std::size_t d = 0; d < r.global.size(); ++d)
          if (q.box_offset[d] < 0 || q.box_extent[d] < 0 || q.box_offset[d] > r.global[d] - q.box_extent[d])
            bad(cat("tensor ", tname, " has a piece in ", q.file, " whose box (offset ",
                    brief(p.at("box_offset").dump()), ", extent ", brief(p.at("box_extent").dump()),
                    ") leaves the global shape ", brief(t.at("global").dump())));
        std::int64_t box = 0;
        detail::product(q.box_extent, box);
        if (q.first < 0 || q.count < 1 || q.first > box - q.count)
          bad(cat("tensor ", tname, " has a piece in ", q.file, " of elements [", q.first, ", ", q.first, " + ",
                  q.count, ") outside its box of ", box));
        r.pieces.push_back(std::move(q));
      }
      m.tensors.emplace(name, std::move(r));
    }
    // The pieces' bytes fit in their files (so that the work of check_coverage, linear in the
    // pieces' rows, is bounded by the files' verified sizes).
    std::vector<std::uint64_t> used(m.files().size(), 0);
    for (const auto& [name, t] : m.tensors)
      for (const PieceRecord& p : t.pieces) {
        const std::size_t f = m.file_index(p.file);
        const std::uint64_t cap = m.files()[f].digest.bytes, es = size_of(t.dtype);
        if (static_cast<std::uint64_t>(p.count) > (cap - used[f]) / es)
          bad(cat("places more bytes in ", p.file, " than its ", cap, " (at tensor ", brief(name), ")"));
        used[f] += static_cast<std::uint64_t>(p.count) * es;
      }
  } catch (const nlohmann::json::exception& e) {
    bad(cat("has a missing or mistyped field (", brief(e.what(), 200), ")"));
  }
  return m;
}

// The text of `dir`/manifest.json, checked before it is read: a regular file (not a link, not a
// FIFO that would block the read) of at most kMaxManifest bytes.
inline std::string read_manifest_text(const std::string& dir) {
  const std::string path = cat(dir, "/manifest.json"), where = cat("manifest(", path, ")");
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0)
    throw Error(where, cat("cannot be read (", std::strerror(errno), ")"), "resume from a complete checkpoint");
  if (S_ISLNK(st.st_mode))
    throw Error(where, "is a symbolic link",
                "weft writes the manifest as a regular file; resume from a checkpoint as saved");
  if (!S_ISREG(st.st_mode)) throw Error(where, "is not a regular file", "resume from a checkpoint as saved");
  if (static_cast<std::uint64_t>(st.st_size) > kMaxManifest)
    throw Error(where, cat("is ", st.st_size, " bytes, over the limit of ", kMaxManifest),
                "this is not a manifest weft writes; resume from another checkpoint");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  detail::Fd fd(path, O_RDONLY | O_NOFOLLOW);
  if (!text.empty()) fd.read_all_at(text.data(), text.size(), 0);
  return text;
}

// The runs of global row-major indices [begin, end) that elements [first, first + count) of a box's
// row-major order occupy: one per row of the box's last dim (adjacent runs merged). f(begin, end).
template <class F>
void for_each_run(const std::vector<std::int64_t>& global, const std::vector<std::int64_t>& offset,
                  const std::vector<std::int64_t>& extent, std::int64_t first, std::int64_t count, F&& f) {
  const std::size_t r = global.size();
  const std::int64_t L = extent[r - 1];
  if (L == 0 || count == 0) return;
  std::int64_t pending_b = -1, pending_e = -1;
  for (std::int64_t i = first; i < first + count;) {
    const std::int64_t row = i / L, col = i % L, n = std::min(L - col, first + count - i);
    // The global linear index of (row's multi-index + offset, offset[last] + col).
    std::int64_t rem = row, lin = 0, stride = 1;
    std::array<std::int64_t, kMaxRank> idx{};
    for (std::size_t d = r - 1; d-- > 0;) {
      idx[d] = rem % extent[d] + offset[d];
      rem /= extent[d];
    }
    for (std::size_t d = r; d-- > 0;) {
      const std::int64_t v = d + 1 == r ? offset[d] + col : idx[d];
      lin += v * stride;
      stride *= global[d];
    }
    if (lin == pending_e) {
      pending_e += n;
    } else {
      if (pending_b >= 0) f(pending_b, pending_e);
      pending_b = lin;
      pending_e = lin + n;
    }
    i += n;
  }
  if (pending_b >= 0) f(pending_b, pending_e);
}

// Every tensor's pieces cover its global shape exactly once.
inline void check_coverage(const Manifest& m, const std::string& where) {
  for (const auto& [name, t] : m.tensors) {
    std::int64_t numel = 0;
    detail::product(t.global, numel);
    std::vector<std::pair<std::int64_t, std::int64_t>> runs;
    for (const PieceRecord& p : t.pieces)
      for_each_run(t.global, p.box_offset, p.box_extent, p.first, p.count,
                   [&](std::int64_t b, std::int64_t e) { runs.emplace_back(b, e); });
    std::sort(runs.begin(), runs.end());
    std::int64_t at = 0;
    for (const auto& [b, e] : runs) {
      if (b < at)
        throw Error(cat("manifest(", where, ")"),
                    cat("tensor ", name, ": elements [", b, ", ", std::min(at, e), ") are held by two pieces"),
                    "save the checkpoint again; each element must be saved once");
      if (b > at)
        throw Error(cat("manifest(", where, ")"),
                    cat("tensor ", name, ": elements [", at, ", ", b, ") of ", numel, " are in no piece"),
                    "save the checkpoint again; a shard is missing");
      at = e;
    }
    if (at != numel)
      throw Error(cat("manifest(", where, ")"),
                  cat("tensor ", name, ": elements [", at, ", ", numel, ") of ", numel, " are in no piece"),
                  "save the checkpoint again; a shard is missing");
  }
}

}  // namespace weft::checkpoint
