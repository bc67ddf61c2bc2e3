// What a load checks before it trusts a checkpoint, and the reads that follow, for any number of
// ranks or one process (Reader). checkpoint.hpp describes the whole.
//
//   1. The manifest: read once per process (thread ranks share the parse), its size and nesting
//      bounded before parsing, every field's type and range checked (manifest.hpp); every rank
//      must read the same manifest (the same directory and bytes), or every rank is refused.
//   2. Every file, the files divided among the ranks: a regular file of the step directory (not a
//      link: nothing is followed out of the directory), of the listed size and XXH3 hash, whose
//      own records of its pieces (pieces.hpp, covered by the hash) are the pieces the manifest
//      places in it. The first bad file's Error, with its cause, on every rank.
//   3. Coverage: every tensor's pieces cover it exactly once (after the sizes are verified: they
//      bound its work).
// All of it is linear in the manifest's size (indexes by file name and key, no pairwise search).
#pragma once

#include <sys/stat.h>
#include <map>
#include <memory>
#include <mutex>

#include "weft/checkpoint/common.hpp"
#include "weft/checkpoint/pieces.hpp"

namespace weft::checkpoint {

namespace detail {

// A manifest as read from a step directory: its records and the XXH3 of its text.
struct Read {
  std::string dir;
  Manifest m;
  std::uint64_t xxh3 = 0;
};

// The manifest of step directory `dir` from its text (read_manifest_text), parsed, and checked
// against the directory's name: step_00000005 holds the manifest of step 5 (a directory of another
// name, "best" say, is taken as it is).
inline Manifest parse_in(const std::string& dir, const std::string& text) {
  Manifest m = parse(text, cat(dir, "/manifest.json"));
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string n = p.filename().string();
  if (n.size() == 13 && n.starts_with("step_") && n.find_first_not_of("0123456789", 5) == std::string::npos &&
      std::stoll(n.substr(5)) != m.step)
    throw Error(cat("checkpoint(", dir, ")"),
                cat("is named for step ", std::stoll(n.substr(5)), " but holds the manifest of step ", m.step),
                "resume from a step directory as it was saved (its name and its manifest agree)");
  return m;
}

// The manifest of step directory `dir`, parsed once per process while any caller holds it: thread
// ranks loading together share one parse (and its memory), keyed by the file's identity (device,
// inode, size, modification time), so a changed manifest is read again.
inline std::shared_ptr<const Read> read_shared(const std::string& dir) {
  const std::string path = cat(dir, "/manifest.json");
  struct stat st{};
  std::string key;
  if (::lstat(path.c_str(), &st) == 0)
    key = cat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const Read>> cache;
  std::lock_guard lock(mu);  // the others wait for the first parse rather than parse beside it
  if (!key.empty())
    if (auto hit = cache[key].lock()) return hit;
  auto out = std::make_shared<Read>();
  out->dir = dir;
  const std::string text = read_manifest_text(dir);
  out->xxh3 = XXH3_64bits(text.data(), text.size());
  out->m = parse_in(dir, text);
  for (auto it = cache.begin(); it != cache.end();) it = it->second.expired() ? cache.erase(it) : std::next(it);
  if (!key.empty()) cache[key] = out;
  return out;
}

// What is wrong with file `f` of the manifest (the pieces `listed` in it), "" when nothing is.
inline std::string check_file(const FileRecord& f, const std::vector<Listed>& listed, const std::string& dir) {
  const std::string path = cat(dir, "/", f.name), where = cat("checkpoint(", path, ")");
  return attempt([&] {
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0)
      throw Error(where, "is missing", "the checkpoint is incomplete; resume from another one");
    if (S_ISLNK(st.st_mode))
      throw Error(where, "is a symbolic link",
                  "weft saves regular files and follows no link out of a checkpoint; resume from one as saved");
    if (!S_ISREG(st.st_mode)) throw Error(where, "is not a regular file", "resume from a checkpoint as saved");
    const Digest d = digest_file(path);
    if (d.bytes != f.digest.bytes)
      throw Error(where, cat("has ", d.bytes, " bytes; the manifest expects ", f.digest.bytes),
                  "the file was truncated or replaced; resume from another checkpoint");
    if (d.xxh3 != f.digest.xxh3)
      throw Error(where, cat("has xxh3 ", hex64(d.xxh3), "; the manifest expects ", hex64(f.digest.xxh3)),
                  "the file is corrupt; resume from another checkpoint");
    if (const std::string diff = compare_pieces(listed, file_pieces(read_header(path), f.name, where)); !diff.empty())
      throw Error(where, diff,
                  "the manifest does not describe this file as it was saved; resume from another checkpoint");
  });
}

// Verifies every file (check_file), the files divided among the ranks; the same Error on every
// rank for the first bad file.
template <class C>
void verify_files(const Manifest& m, const std::string& dir, C& world) {
  const auto listed = pieces_by_file(m);
  const std::size_t n = m.files().size();
  const int me = world.rank(), size = world.size();
  std::int64_t first = static_cast<std::int64_t>(n);  // this rank's first bad file
  std::string message;
  for (std::size_t i = static_cast<std::size_t>(me); i < n; i += static_cast<std::size_t>(size))
    if (std::string e = check_file(m.files()[i], listed[i], dir); !e.empty()) {
      first = static_cast<std::int64_t>(i);
      message = std::move(e);
      break;
    }
  std::array<std::int64_t, 1> worst{static_cast<std::int64_t>(n) - first};  // the lowest bad file, as a max
  world.all_reduce(std::span<std::int64_t>(worst), ReduceOp::max);
  if (worst[0] == 0) return;
  const std::size_t bad = n - static_cast<std::size_t>(worst[0]);
  const std::string text = share_text(world, message, static_cast<int>(bad % static_cast<std::size_t>(size)));
  throw Error("checkpoint::load", text, "");
}

// Refuses a checkpoint whose model record (the manifest's "model") differs from this model's in any
// field, naming it.
inline void check_model(const nlohmann::json& saved, const std::vector<std::pair<std::string, std::int64_t>>& mine,
                        const std::string& where) {
  for (const auto& [k, v] : mine) {
    if (!saved.contains(k))
      throw Error(where, cat("records no ", k, " for its model; this model has ", k, " = ", v),
                  "load a checkpoint of a model of the same configuration");
    if (!saved[k].is_number_integer() || saved[k].get<std::int64_t>() != v)
      throw Error(
          where,
          cat("was saved from a model with ", k, " = ", brief(saved[k].dump()), "; this model has ", k, " = ", v),
          "load it into a model of the same configuration");
  }
  for (const auto& [k, v] : saved.items()) {
    bool known = false;
    for (const auto& f : mine) known = known || f.first == k;
    if (!known)
      throw Error(
          where,
          cat("was saved from a model with ", brief(k), " = ", brief(v.dump()), ", which this model does not have"),
          "load a checkpoint of this model");
  }
}

// Reads pieces' byte ranges, each file opened once with its header validated.
class Sources {
 public:
  Sources(const Manifest& m, std::string dir) : m_(&m), dir_(std::move(dir)) {}

  struct Open {
    std::unique_ptr<detail::Fd> fd;
    Header header;
  };
  Open& open(const std::string& file) {
    auto it = files_.find(file);
    if (it != files_.end()) return it->second;
    const std::string path = cat(dir_, "/", file);
    Open o{nullptr, read_header(path)};
    o.fd = std::make_unique<detail::Fd>(path, O_RDONLY | O_NOFOLLOW);
    return files_.emplace(file, std::move(o)).first->second;
  }
  // The byte offset in `file` of element i of piece p of tensor `name` (checked against the header).
  std::uint64_t locate(const std::string& name, const TensorRecord& t, const PieceRecord& p) {
    Open& o = open(p.file);
    const TensorInfo* info = o.header.find(p.key);
    const std::string where = cat("checkpoint(", dir_, "/", p.file, ")");
    if (!info)
      throw Error(where, cat("has no tensor ", p.key, ", which the manifest places there for ", name),
                  "save the checkpoint again");
    if (info->dtype != t.dtype || info->shape != std::vector<std::int64_t>{p.count})
      throw Error(where,
                  cat("holds ", p.key, " as ", safetensors_dtype(info->dtype), " of ",
                      info->shape.size() == 1 ? info->shape[0] : -1, " elements; the manifest expects ",
                      safetensors_dtype(t.dtype), " of ", p.count),
                  "save the checkpoint again");
    return o.header.data_start + info->begin;
  }
  const Manifest& manifest() const { return *m_; }
  const std::string& dir() const { return dir_; }

 private:
  const Manifest* m_;
  std::string dir_;
  std::map<std::string, Open> files_;
};

// Fills elements [first, first + count) of an entry's shard (box `offset`, `extent` of `global`)
// into host buffer `out` (count elements of X) from tensor `name`, elements outside `logical` left
// as they are in `out`.
template <class X>
void fill(Sources& src, const std::string& name, const std::vector<std::int64_t>& global,
          const std::vector<std::int64_t>& logical, const std::vector<std::int64_t>& offset,
          const std::vector<std::int64_t>& extent, std::int64_t first, std::int64_t count, X* out) {
  const auto it = src.manifest().tensors.find(name);
  const std::string where = cat("checkpoint(", src.dir(), ")");
  if (it == src.manifest().tensors.end())
    throw Error(where, cat("has no tensor ", name),
                "load a checkpoint of this model (and with optimizer state, for a resume)");
  const TensorRecord& t = it->second;
  if (t.logical != logical)
    throw Error(where,
                cat("tensor ", name, " has the shape ", join(t.logical, "x"), "; this model's is ", join(logical, "x")),
                "load a checkpoint of a model of the same sizes");
  const std::size_t r = global.size(), es = size_of(t.dtype);
  std::vector<std::uint64_t> bases(t.pieces.size());
  for (std::size_t i = 0; i < t.pieces.size(); ++i) bases[i] = src.locate(name, t, t.pieces[i]);
  // The saved pieces' runs by their first global linear index: begin -> (end, (piece, element)).
  std::map<std::int64_t, std::pair<std::int64_t, std::pair<std::size_t, std::int64_t>>> runs;
  for (std::size_t i = 0; i < t.pieces.size(); ++i) {
    const PieceRecord& p = t.pieces[i];
    std::int64_t el = 0;
    for_each_run(t.global, p.box_offset, p.box_extent, p.first, p.count, [&](std::int64_t b, std::int64_t e) {
      runs[b] = {e, {i, el}};
      el += e - b;
    });
  }
  // What this rank wants: (element of out, saved global linear index, length), inside `logical`.
  struct Want {
    std::int64_t dst, pos, len;
  };
  std::vector<Want> want;
  bool same_rows = true;  // only the leading dim may differ (padding rows): linear indices agree
  std::int64_t row_stride = 1;
  for (std::size_t d = 1; d < r; ++d) {
    same_rows = same_rows && global[d] == t.global[d] && logical[d] == global[d];
    row_stride *= global[d];
  }
  if (same_rows) {
    const std::int64_t limit = logical[0] * row_stride;
    std::int64_t dst = 0;
    for_each_run(global, offset, extent, first, count, [&](std::int64_t b, std::int64_t e) {
      if (b < std::min(e, limit)) want.push_back({dst, b, std::min(e, limit) - b});
      dst += e - b;
    });
  } else {  // row by row, mapping each position to the saved tensor's strides
    const std::int64_t L = extent[r - 1];
    std::vector<std::int64_t> idx(r);
    for (std::int64_t i = first; i < first + count;) {
      const std::int64_t row = i / L, col = i % L, n = std::min(L - col, first + count - i);
      std::int64_t rem = row;
      for (std::size_t d = r - 1; d-- > 0;) {
        idx[d] = rem % extent[d] + offset[d];
        rem /= extent[d];
      }
      idx[r - 1] = offset[r - 1] + col;
      bool inside = true;
      for (std::size_t d = 0; d + 1 < r; ++d) inside = inside && idx[d] < logical[d];
      const std::int64_t c_end = std::min(idx[r - 1] + n, logical[r - 1]);
      if (inside && idx[r - 1] < c_end) {
        std::int64_t lin = 0;
        for (std::size_t d = 0; d < r; ++d) lin = lin * t.global[d] + idx[d];
        want.push_back({i - first, lin, c_end - idx[r - 1]});
      }
      i += n;
    }
  }
  std::vector<std::byte> buf;
  for (const Want& w : want) {
    std::int64_t pos = w.pos;
    X* dst = out + w.dst;
    while (pos < w.pos + w.len) {
      auto it2 = runs.upper_bound(pos);
      if (it2 == runs.begin() || std::prev(it2)->second.first <= pos)
        throw Error(where, cat("tensor ", name, ": element ", pos, " is in no piece"), "save the checkpoint again");
      --it2;
      const auto& [end, at] = it2->second;
      const std::int64_t take = std::min(w.pos + w.len, end) - pos;
      const std::int64_t element = at.second + (pos - it2->first);
      buf.resize(static_cast<std::size_t>(take) * es);
      src.open(t.pieces[at.first].file)
          .fd->read_all_at(buf.data(), buf.size(), bases[at.first] + static_cast<std::uint64_t>(element) * es);
      for (std::int64_t k = 0; k < take; ++k)
        dst[k] = convert_element<X>(t.dtype, buf.data() + static_cast<std::size_t>(k) * es);
      dst += take;
      pos += take;
    }
  }
}

// A world of one process (for Reader).
struct Solo {
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class X>
  void all_reduce(std::span<X>, ReduceOp = ReduceOp::sum) {}
  template <class X>
  void broadcast(std::span<X>, int) {}
};

}  // namespace detail

// The manifest of the checkpoint at `path` (resolved as load() resolves it), parsed and validated,
// its files not yet verified: what a trainer checks before it builds anything (the step it resumes).
inline Manifest peek(const std::string& path) {
  const std::string dir = resolve(path);
  return detail::parse_in(dir, read_manifest_text(dir));
}

// A checkpoint opened by one process, verified as load() verifies it (manifest, coverage, every
// file's size and hash); read() returns a tensor's logical part whole, row-major, in any element
// type. For tools (weft-export) and tests.
class Reader {
 public:
  explicit Reader(const std::string& path) : dir_(resolve(path)) {
    m_ = detail::parse_in(dir_, read_manifest_text(dir_));
    detail::Solo solo;
    detail::verify_files(m_, dir_, solo);
    check_coverage(m_, cat(dir_, "/manifest.json"));  // after the sizes are verified: they bound its work
  }
  const Manifest& manifest() const { return m_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return m_.tensors.contains(name); }
  const std::vector<std::int64_t>& shape(const std::string& name) const { return record(name).logical; }

  template <class X>
  std::vector<X> read(const std::string& name) const {
    const std::vector<std::int64_t>& l = record(name).logical;
    std::int64_t n = 0;
    detail::product(l, n);
    std::vector<X> out(static_cast<std::size_t>(n));
    detail::Sources src(m_, dir_);
    if (n > 0) detail::fill(src, name, l, l, std::vector<std::int64_t>(l.size(), 0), l, 0, n, out.data());
    return out;
  }

 private:
  const TensorRecord& record(const std::string& name) const {
    const auto it = m_.tensors.find(name);
    if (it == m_.tensors.end())
      throw Error(cat("checkpoint(", dir_, ")"), cat("has no tensor ", name), "ask for one of the manifest's tensors");
    return it->second;
  }
  std::string dir_;
  Manifest m_;
};

}  // namespace weft::checkpoint
