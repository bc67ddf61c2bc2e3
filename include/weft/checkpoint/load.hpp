// Loading checkpoints: file verification spread over the ranks, byte-range reads of the pieces
// that overlap what a rank holds, load() into any mesh, strategy and precision, and Reader for one
// process. checkpoint.hpp describes the whole.
#pragma once

#include <map>
#include <memory>

#include "weft/checkpoint/common.hpp"
#include "weft/core/precision.hpp"
#include "weft/nn/unit.hpp"

namespace weft::checkpoint {

namespace detail {

// Verifies every file's size and hash, the files divided among the ranks; the same Error on every
// rank for the first bad file.
template <class C>
void verify_files(const Manifest& m, const std::string& dir, C& world) {
  const std::size_t n = m.files.size();
  std::vector<std::int64_t> status(3 * n, 0);  // per file: 1 + kind of failure, actual bytes, actual hash
  std::vector<std::string> messages(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(world.size())) != world.rank()) continue;
    const std::string path = cat(dir, "/", m.files[i].name);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      status[3 * i] = 1;
      continue;
    }
    const Digest d = digest_file(path);
    if (d.bytes != m.files[i].digest.bytes) status[3 * i] = 2;
    else if (d.xxh3 != m.files[i].digest.xxh3) status[3 * i] = 3;
    status[3 * i + 1] = static_cast<std::int64_t>(d.bytes);
    status[3 * i + 2] = std::bit_cast<std::int64_t>(d.xxh3);
  }
  world.all_reduce(std::span<std::int64_t>(status), ReduceOp::sum);  // one rank wrote each file's entries
  for (std::size_t i = 0; i < n; ++i) {
    const FileRecord& f = m.files[i];
    const std::string where = cat("checkpoint(", dir, "/", f.name, ")");
    switch (status[3 * i]) {
      case 1: throw Error(where, "is missing", "the checkpoint is incomplete; resume from another one");
      case 2:
        throw Error(where, cat("has ", status[3 * i + 1], " bytes; the manifest expects ", f.digest.bytes),
                    "the file was truncated or replaced; resume from another checkpoint");
      case 3:
        throw Error(where, cat("has xxh3 ", hex64(std::bit_cast<std::uint64_t>(status[3 * i + 2])), "; the manifest expects ", hex64(f.digest.xxh3)),
                    "the file is corrupt; resume from another checkpoint");
      default: break;
    }
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
    o.fd = std::make_unique<detail::Fd>(path, O_RDONLY);
    return files_.emplace(file, std::move(o)).first->second;
  }
  // The byte offset in `file` of element i of piece p of tensor `name` (checked against the header).
  std::uint64_t locate(const std::string& name, const TensorRecord& t, const PieceRecord& p) {
    Open& o = open(p.file);
    const TensorInfo* info = o.header.find(p.key);
    const std::string where = cat("checkpoint(", dir_, "/", p.file, ")");
    if (!info) throw Error(where, cat("has no tensor ", p.key, ", which the manifest places there for ", name), "save the checkpoint again");
    if (info->dtype != t.dtype || info->shape != std::vector<std::int64_t>{p.count})
      throw Error(where, cat("holds ", p.key, " as ", safetensors_dtype(info->dtype), " of ", info->shape.size() == 1 ? info->shape[0] : -1,
                             " elements; the manifest expects ", safetensors_dtype(t.dtype), " of ", p.count),
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
void fill(Sources& src, const std::string& name, const std::vector<std::int64_t>& global, const std::vector<std::int64_t>& logical,
          const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& extent, std::int64_t first, std::int64_t count,
          X* out) {
  const auto it = src.manifest().tensors.find(name);
  const std::string where = cat("checkpoint(", src.dir(), ")");
  if (it == src.manifest().tensors.end())
    throw Error(where, cat("has no tensor ", name), "load a checkpoint of this model (and with optimizer state, for a resume)");
  const TensorRecord& t = it->second;
  if (t.logical != logical)
    throw Error(where, cat("tensor ", name, " has the shape ", join(t.logical, "x"), "; this model's is ", join(logical, "x")),
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
      src.open(t.pieces[at.first].file).fd->read_all_at(buf.data(), buf.size(), bases[at.first] + static_cast<std::uint64_t>(element) * es);
      for (std::int64_t k = 0; k < take; ++k) dst[k] = convert_element<X>(t.dtype, buf.data() + static_cast<std::size_t>(k) * es);
      dst += take;
      pos += take;
    }
  }
}

}  // namespace detail

struct LoadOptions {
  bool optimizer = true;  // also the optimizer state and step (false: the weights only)
};

// Loads the checkpoint at `path` (a step directory, or a directory with `latest`) into what this
// rank holds of model and dp, whatever mesh, strategy and precision saved it. Every rank calls it.
template <class Model, class DP, CheckpointMesh M>
RunState load(const std::string& path, Model& model, DP& dp, M& mesh, LoadOptions opt = {}) {
  using T = typename Model::value_type;
  using G = master_t<T>;
  auto& world = mesh.world();
  std::string dir;
  Manifest m;
  std::string err = detail::attempt([&] {
    dir = resolve(path);
    std::ifstream in(cat(dir, "/manifest.json"), std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    m = parse(text, cat(dir, "/manifest.json"));
    if constexpr (requires { model.config.heads; })
      if (m.model.contains("heads") && m.model["heads"] != model.config.heads)
        throw Error(cat("checkpoint(", dir, ")"), cat("was saved with ", m.model["heads"].dump(), " heads; this model has ", model.config.heads),
                    "load it into a model of the same sizes");
  });
  // Every rank resolved and parsed the same files; a failure is everyone's (and the same message).
  if (!err.empty()) throw Error("checkpoint::load", err, "pass a complete, valid checkpoint");
  detail::verify_files(m, dir, world);
  check_coverage(m, cat(dir, "/manifest.json"));  // after the sizes are verified: they bound its work

  detail::Sources src(m, dir);
  const bool has_master = std::any_of(m.tensors.begin(), m.tensors.end(), [](const auto& kv) { return kv.first.starts_with("master/"); });
  auto& dev = model.dev();
  auto units = model.units();
  err = detail::attempt([&] {
    for (std::size_t u = 0; u < units.size(); ++u) {
      const auto h = dp.holding(u);
      for (const nn::UnitEntry& e : units[u].entries()) {
        const auto g = detail::dims(e.global), l = detail::dims(e.logical), off = detail::dims(e.box_offset), ext = detail::dims(e.local);
        // Fills the part of [lo, lo + n) of the unit that is this entry, at p (element lo).
        auto load_range = [&]<class X>(const std::string& kind, X* p, std::int64_t lo, std::int64_t n) {
          const std::int64_t a = std::max(lo, e.offset), b = std::min(lo + n, e.offset + e.numel);
          if (a >= b) return;
          std::vector<X> host(static_cast<std::size_t>(b - a));
          dev.to_host(host.data(), p + (a - lo), host.size() * sizeof(X));  // keeps padding as it is
          detail::fill(src, cat(kind, "/", e.name), g, l, off, ext, a - e.offset, b - a, host.data());
          dev.from_host(p + (a - lo), host.data(), host.size() * sizeof(X));
        };
        const std::string precise = has_master ? "master" : "param";
        load_range.template operator()<T>(precise, h.values, h.values_lo, h.values_n);
        if (h.master) load_range.template operator()<G>(precise, h.master, h.lo, h.n);
        if (opt.optimizer)
          for (std::size_t k = 0; k < h.state.size(); ++k)
            load_range.template operator()<std::remove_pointer_t<std::remove_cvref_t<decltype(h.state[0])>>>(DP::rule_type::state_names[k], h.state[k], h.lo, h.n);
      }
    }
    dev.synchronize();
  });
  detail::agree(world, err, "loading the checkpoint");
  RunState st;
  if (opt.optimizer) {
    dp.restore(m.optimizer.value("steps", std::int64_t{0}), m.optimizer.value("skipped", std::int64_t{0}));
    st.step = m.run.value("step", std::int64_t{0});
    st.loader_position = m.run.value("loader_position", std::int64_t{0});
    st.seed = m.run.value("seed", std::uint64_t{0});
    if (m.run.contains("extra")) st.extra = m.run["extra"];
  } else {
    dp.restore(0, 0);
  }
  return st;
}

namespace detail {
// A world of one process (for Reader).
struct Solo {
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class X>
  void all_reduce(std::span<X>, ReduceOp = ReduceOp::sum) {}
};
}  // namespace detail

// A checkpoint opened by one process, verified as load() verifies it (manifest, coverage, every
// file's size and hash); read() returns a tensor's logical part whole, row-major, in any element
// type. For tools (weft-export) and tests.
class Reader {
 public:
  explicit Reader(const std::string& path) : dir_(resolve(path)) {
    std::ifstream in(cat(dir_, "/manifest.json"), std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    m_ = parse(text, cat(dir_, "/manifest.json"));
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
    if (it == m_.tensors.end()) throw Error(cat("checkpoint(", dir_, ")"), cat("has no tensor ", name), "ask for one of the manifest's tensors");
    return it->second;
  }
  std::string dir_;
  Manifest m_;
};


}  // namespace weft::checkpoint
