// The pieces a checkpoint file holds, as the file itself records them.
//
// Each file a save writes (rank_<r>.safetensors, or model.safetensors) stores its pieces as 1-D
// tensors and, in its metadata ("weft.pieces"), where each piece lies: the tensor it belongs to,
// that tensor's global and logical shape and layout, and the box and range of the piece. The
// manifest's tensor records are built from these records when a save is published, and a load
// checks them against the records again: the file's hash, which the manifest lists, covers its
// metadata, so a piece the manifest places differently from its file (two tensors' pieces swapped,
// a box moved) is refused rather than loaded into the wrong weights.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "weft/checkpoint/manifest.hpp"
#include "weft/checkpoint/safetensors.hpp"
#include "weft/core/json_limits.hpp"

namespace weft::checkpoint {

namespace detail {

// One piece this rank saves: host bytes and where they lie.
struct Staged {
  std::string tensor;  // "param/wte"
  DType dtype = DType::f32;
  std::vector<std::int64_t> global, logical, box_offset, box_extent;
  std::string layout;
  std::int64_t first = 0, count = 0;
  std::vector<std::byte> bytes;
};

// A staged piece's record in a file's metadata ("weft.pieces") and in a consolidated save's
// messages (save.hpp's pack, which adds the dtype).
inline nlohmann::json piece_record(const Staged& s) {
  return {{"tensor", s.tensor},         {"global", s.global},         {"logical", s.logical}, {"layout", s.layout},
          {"box_offset", s.box_offset}, {"box_extent", s.box_extent}, {"first", s.first},     {"count", s.count}};
}

// Writes staged pieces as one file; the pieces' layout goes in its metadata ("weft.pieces"). Piece
// i's bytes come from bytes_of(i, n) (write_streamed), so a writer that makes them one at a time
// (an import) holds one piece, not the file; by default from the pieces' own bytes.
template <class BytesOf>
Digest write_staged(const std::string& path, const std::vector<Staged>& staged, BytesOf bytes_of) {
  std::vector<TensorData> tensors;
  nlohmann::json meta = nlohmann::json::array();
  for (const Staged& s : staged) {
    tensors.push_back({s.tensor, s.dtype, {s.count}, nullptr});
    meta.push_back(piece_record(s));
  }
  return write_streamed(path, std::span<const TensorData>(tensors), {{"weft.pieces", meta.dump()}}, bytes_of);
}
inline Digest write_staged(const std::string& path, const std::vector<Staged>& staged) {
  return write_staged(path, staged,
                      [&](std::size_t i, std::uint64_t) { return std::span<const std::byte>(staged[i].bytes); });
}

}  // namespace detail

// A piece as its file records it.
struct FilePiece {
  std::string tensor;  // the manifest's tensor name; also the file's key for the piece
  DType dtype = DType::f32;
  std::vector<std::int64_t> global, logical;
  std::string layout;
  PieceRecord piece;
};

// The pieces file `file` (its header h, already validated) records, in the file's order; every one
// names a tensor of the file as its key. `where` names the file in errors.
inline std::vector<FilePiece> file_pieces(const Header& h, const std::string& file, const std::string& where) {
  const auto it = h.metadata.find("weft.pieces");
  if (it == h.metadata.end()) throw Error(where, "has no weft.pieces metadata", "save the checkpoint again");
  // The metadata is an array of flat records: 3 levels (array, record, box).
  check_json_limits(it->second, {.max_bytes = kMaxHeader, .max_depth = 3}, cat(where, " weft.pieces metadata"));
  std::vector<FilePiece> out;
  try {
    const auto records = nlohmann::json::parse(it->second);
    if (!records.is_array())
      throw Error(where, "has weft.pieces metadata that is not an array", "save the checkpoint again");
    out.reserve(records.size());
    for (const auto& p : records) {
      FilePiece f;
      f.tensor = p.at("tensor").get<std::string>();
      const TensorInfo* info = h.find(f.tensor);
      if (!info)
        throw Error(where, cat("lists a piece ", brief(f.tensor), " it does not hold"), "save the checkpoint again");
      f.dtype = info->dtype;
      f.global = p.at("global").get<std::vector<std::int64_t>>();
      f.logical = p.at("logical").get<std::vector<std::int64_t>>();
      f.layout = p.at("layout").get<std::string>();
      f.piece = {file,
                 f.tensor,
                 p.at("box_offset").get<std::vector<std::int64_t>>(),
                 p.at("box_extent").get<std::vector<std::int64_t>>(),
                 p.at("first").get<std::int64_t>(),
                 p.at("count").get<std::int64_t>()};
      if (info->shape != std::vector<std::int64_t>{f.piece.count})
        throw Error(where,
                    cat("holds ", brief(f.tensor), " as ", info->shape.size() == 1 ? info->shape[0] : -1,
                        " elements; its record says ", f.piece.count),
                    "save the checkpoint again");
      out.push_back(std::move(f));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(where, cat("has malformed weft.pieces metadata (", brief(e.what(), 200), ")"),
                "save the checkpoint again");
  }
  return out;
}

// Adds the pieces of `dir`/`file` to m's tensors (publishing a save).
inline void add_pieces(Manifest& m, const std::string& dir, const std::string& file) {
  const std::string path = cat(dir, "/", file);
  for (FilePiece& f : file_pieces(read_header(path), file, cat("checkpoint(", path, ")"))) {
    TensorRecord& t = m.tensors[f.tensor];
    t.dtype = f.dtype;
    t.global = std::move(f.global);
    t.logical = std::move(f.logical);
    t.layout = std::move(f.layout);
    t.pieces.push_back(std::move(f.piece));
  }
}

// A piece the manifest lists: its tensor's name and record, and the piece.
struct Listed {
  const std::string* tensor;
  const TensorRecord* record;
  const PieceRecord* piece;
};

// The manifest's pieces by file: entry i lists the pieces in m.files()[i] (one pass over the pieces).
inline std::vector<std::vector<Listed>> pieces_by_file(const Manifest& m) {
  std::vector<std::vector<Listed>> out(m.files().size());
  for (const auto& [name, t] : m.tensors)
    for (const PieceRecord& p : t.pieces)
      if (const std::size_t f = m.file_index(p.file); f < out.size()) out[f].push_back({&name, &t, &p});
  return out;
}

// Where the manifest's pieces in one file (`listed`) differ from the file's own records, a sentence
// naming the tensor and the field ("" when they agree): every piece the manifest places in the file
// must be one the file records under that key, for that tensor, with the same dtype, shapes, layout,
// box and range, and the file must hold no piece the manifest leaves out.
inline std::string compare_pieces(const std::vector<Listed>& listed, const std::vector<FilePiece>& recorded) {
  std::unordered_map<std::string, const FilePiece*> by_key;
  for (const FilePiece& f : recorded) by_key.emplace(f.piece.key, &f);
  for (const Listed& l : listed) {
    const std::string& name = *l.tensor;
    const TensorRecord& t = *l.record;
    const PieceRecord& p = *l.piece;
    const auto it = by_key.find(p.key);
    if (it == by_key.end())
      return cat("the manifest places a piece of ", name, " under the key ", brief(p.key),
                 ", which the file does not record");
    const FilePiece& f = *it->second;
    const char* field = f.tensor != name                                       ? "tensor"
                        : f.dtype != t.dtype                                   ? "dtype"
                        : f.global != t.global                                 ? "global shape"
                        : f.logical != t.logical                               ? "logical shape"
                        : f.layout != t.layout                                 ? "layout"
                        : f.piece.box_offset != p.box_offset                   ? "box offset"
                        : f.piece.box_extent != p.box_extent                   ? "box extent"
                        : f.piece.first != p.first || f.piece.count != p.count ? "element range"
                                                                               : nullptr;
    if (field)
      return cat("the manifest's piece of ", name, " under the key ", brief(p.key),
                 " differs from the file's record of it in its ", field,
                 f.tensor != name ? cat(" (the file records a piece of ", brief(f.tensor), " there)") : std::string());
  }
  if (listed.size() != recorded.size())
    return cat("the file records ", recorded.size(), " pieces; the manifest places ", listed.size(), " in it");
  return {};
}

}  // namespace weft::checkpoint
