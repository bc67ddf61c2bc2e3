// safetensors files, read and written by weft's own validated code.
//
// Format (Hugging Face's): an 8-byte little-endian header length n; n bytes of UTF-8 JSON mapping
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that
// follows the header), plus an optional "__metadata__" object of strings; then the data.
//
// read_header() validates everything before it trusts a size, and allocates nothing from a size it
// has not checked:
//   - the file holds at least 8 bytes; the header length is at most kMaxHeader (100 MB) and fits
//     in the file;
//   - the header is valid UTF-8 JSON (nlohmann_json parses it) whose top level is an object, with
//     no name twice, names of 1 to kMaxName bytes, known dtypes, shapes of at most kMaxRank
//     non-negative dims;
//   - shape x dtype size equals end - begin, in checked 64-bit arithmetic;
//   - the data ranges, sorted, start at 0, are contiguous and non-overlapping, and end exactly at
//     the end of the file (header plus data equal the file's length).
// Every failure is a weft::Error naming the file, the tensor and the values.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "weft/checkpoint/files.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/core/json_limits.hpp"

namespace weft::checkpoint {

inline constexpr std::uint64_t kMaxHeader = 100ull << 20;
inline constexpr std::size_t kMaxRank = 8;
inline constexpr std::size_t kMaxName = 1024;

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte range in the data section
};

struct Header {
  std::vector<TensorInfo> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  // 8 + header length: where the data section begins in the file
  const TensorInfo* find(const std::string& name) const {
    const auto it = index.find(name);
    return it == index.end() ? nullptr : &tensors[it->second];
  }
  std::unordered_map<std::string, std::size_t> index;  // name -> position in tensors
};

// The deepest nesting in a header: its object, a tensor's entry, the entry's shape (3); more is
// refused before parsing (json_limits.hpp).
inline constexpr JsonLimits kHeaderLimits{.max_bytes = kMaxHeader, .max_depth = 8};

// safetensors' dtype names for weft's element types.
constexpr const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

namespace detail {

[[noreturn]] inline void bad(const std::string& path, const std::string& what, const std::string& fix) {
  throw Error(cat("safetensors(", path, ")"), what, fix);
}

inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  out = a * b;
  return true;
}

}  // namespace detail

namespace detail {
inline Header parse_json_header(const std::string& path, const std::string& text, std::uint64_t file_size);
}  // namespace detail

// Validates a whole safetensors file held in memory (`where` names it in errors): the same checks
// as read_header. For tools and the fuzz target (tests/fuzz/safetensors.cpp).
inline Header parse_header(std::span<const unsigned char> file, const std::string& where = "memory") {
  using detail::bad;
  if (file.size() < 8)
    bad(where, cat("the file has ", file.size(), " bytes, fewer than the 8-byte header length"),
        "pass a complete file");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<std::size_t>(i)];  // little-endian
  if (n > kMaxHeader)
    bad(where, cat("the header length ", n, " exceeds the ", kMaxHeader, "-byte cap"), "pass a valid file");
  if (n > file.size() - 8)
    bad(where, cat("the header length ", n, " runs past the end of the ", file.size(), "-byte file"),
        "pass a complete file");
  return detail::parse_json_header(
      where, std::string(reinterpret_cast<const char*>(file.data()) + 8, static_cast<std::size_t>(n)), file.size());
}

// Reads and validates the header of the safetensors file at `path`.
inline Header read_header(const std::string& path) {
  using detail::bad;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    bad(path, "is not a regular file (missing, a directory, or a device)", "pass the path of a safetensors file");
  const std::uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) bad(path, cat("cannot read its size (", ec.message(), ")"), "check the path and its permissions");
  if (file_size < 8)
    bad(path, cat("the file has ", file_size, " bytes, fewer than the 8-byte header length"), "pass a complete file");
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot be opened", "check its permissions");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];  // little-endian
  if (n > kMaxHeader)
    bad(path, cat("the header length ", n, " exceeds the ", kMaxHeader, "-byte cap"), "pass a valid file");
  if (n > file_size - 8)
    bad(path, cat("the header length ", n, " runs past the end of the ", file_size, "-byte file"),
        "pass a complete file");
  std::string text(static_cast<std::size_t>(n), '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (!in) bad(path, "the header could not be read", "check the file");
  return detail::parse_json_header(path, text, file_size);
}

// The header's JSON: names, dtypes, shapes, offsets, and the data ranges against the file's size.
inline Header detail::parse_json_header(const std::string& path, const std::string& text, std::uint64_t file_size) {
  using detail::bad;
  const std::uint64_t n = text.size();
  check_json_limits(text, kHeaderLimits, cat("safetensors(", path, ") header"));
  // Parse, rejecting a name given twice (nlohmann would keep the last silently).
  std::set<std::string> names;
  std::string duplicate;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
          !names.insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    bad(path, cat("the header is not valid UTF-8 JSON (", e.what(), ")"), "pass a valid file");
  }
  if (!duplicate.empty())
    bad(path, cat("the tensor name \"", duplicate, "\" appears twice"), "give each tensor one entry");
  if (!doc.is_object()) bad(path, "the header is not a JSON object", "pass a valid file");

  Header h;
  h.data_start = 8 + n;
  const std::uint64_t data_size = file_size - 8 - n;
  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) bad(path, "__metadata__ is not an object", "store metadata as a string-to-string object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) bad(path, cat("metadata \"", k, "\" is not a string"), "store metadata values as strings");
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = cat("tensor \"", name.substr(0, 64), name.size() > 64 ? "..." : "", "\"");
    if (name.empty() || name.size() > kMaxName)
      bad(path, cat("a tensor name of ", name.size(), " bytes"), cat("use names of 1 to ", kMaxName, " bytes"));
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      bad(path, cat(where, " lacks dtype, shape or data_offsets"), "give every tensor all three");
    TensorInfo t;
    t.name = name;
    const auto& dt = entry["dtype"];
    bool known = false;
    for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64})
      if (dt.is_string() && dt.get<std::string>() == safetensors_dtype(d)) {
        t.dtype = d;
        known = true;
      }
    if (!known) bad(path, cat(where, " has dtype ", dt.dump().substr(0, 32)), "use F64, F32, BF16, F16, I32 or I64");
    const auto& shape = entry["shape"];
    if (!shape.is_array() || shape.size() > kMaxRank)
      bad(path, cat(where, " has a shape that is not an array of at most ", kMaxRank, " dims"),
          "store the shape as a short array");
    std::uint64_t elements = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() ||
          d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        bad(path, cat(where, " has a dim ", d.dump().substr(0, 32), " that is not a non-negative integer"),
            "use dims >= 0");
      t.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
      if (!detail::checked_mul(elements, d.get<std::uint64_t>(), elements))
        bad(path, cat(where, " has more elements than 2^64"), "pass a valid file");
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(path, cat(where, " has data_offsets that are not two non-negative integers"), "store [begin, end]");
    t.begin = off[0].get<std::uint64_t>();
    t.end = off[1].get<std::uint64_t>();
    std::uint64_t bytes = 0;
    if (!detail::checked_mul(elements, size_of(t.dtype), bytes))
      bad(path, cat(where, " is larger than 2^64 bytes"), "pass a valid file");
    if (t.end < t.begin || t.end - t.begin != bytes)
      bad(path,
          cat(where, ": shape ", shape.dump(), " of ", safetensors_dtype(t.dtype), " is ", bytes,
              " bytes but its data_offsets [", t.begin, ", ", t.end, "] hold ", t.end >= t.begin ? t.end - t.begin : 0),
          "store offsets that match the shape and dtype");
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin != at)
      bad(path,
          cat("tensor \"", t.name, "\" starts at byte ", t.begin, " of the data but the one before it ends at ", at),
          "store the tensors contiguously, without gaps or overlaps");
    at = t.end;
  }
  for (std::size_t i = 0; i < h.tensors.size(); ++i) h.index.emplace(h.tensors[i].name, i);
  if (at != data_size)
    bad(path, cat("the tensors' data ends at byte ", at, " but the file holds ", data_size, " bytes of data"),
        "pass a file whose length is the header plus the tensors' data");
  return h;
}

// Reads `bytes` bytes at `offset` of the data section of a file whose header is h.
inline void read_bytes(const std::string& path, const Header& h, std::uint64_t offset, std::uint64_t bytes, void* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::bad(path, "cannot be opened", "check its permissions");
  in.seekg(static_cast<std::streamoff>(h.data_start + offset));
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(bytes));
  if (!in || static_cast<std::uint64_t>(in.gcount()) != bytes)
    detail::bad(path, cat("reading ", bytes, " bytes at data offset ", offset, " failed"),
                "check that the file was not truncated");
}

// A tensor to write: its name, element type, shape, and the bytes (shape x dtype size).
struct TensorData {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
};

// Writes a safetensors file whose tensors' bytes may be made one at a time, so that a writer need
// hold only one tensor: the header (padded with spaces to a multiple of 8 bytes) from the names,
// dtypes and shapes of `tensors` (their data unused), then for each tensor i in order the bytes
// that bytes_of(i, n) returns (n = shape x dtype size of them; valid until the next call). fsyncs the file
// and returns its size and hash (files.hpp).
template <class BytesOf>
Digest write_streamed(const std::string& path, std::span<const TensorData> tensors,
                      const std::map<std::string, std::string>& metadata, BytesOf bytes_of) {
  nlohmann::json doc = nlohmann::json::object();
  if (!metadata.empty()) doc["__metadata__"] = metadata;
  std::uint64_t at = 0;
  std::set<std::string> seen;
  std::vector<std::uint64_t> sizes;
  for (const TensorData& t : tensors) {
    if (t.name.empty() || t.name.size() > kMaxName || t.name == "__metadata__" || !seen.insert(t.name).second)
      detail::bad(
          path,
          cat("cannot write a tensor named \"", t.name.substr(0, 64), "\" (empty, too long, reserved or repeated)"),
          "give each tensor a unique name of 1 to 1024 bytes");
    if (t.shape.size() > kMaxRank)
      detail::bad(path, cat("tensor \"", t.name, "\" has ", t.shape.size(), " dims"), "use at most 8");
    std::uint64_t bytes = size_of(t.dtype);
    for (std::int64_t d : t.shape) {
      if (d < 0) detail::bad(path, cat("tensor \"", t.name, "\" has a dim ", d), "use dims >= 0");
      if (!detail::checked_mul(bytes, static_cast<std::uint64_t>(d), bytes))
        detail::bad(path, "a tensor of more than 2^64 bytes", "write smaller tensors");
    }
    doc[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
    sizes.push_back(bytes);
  }
  std::string text = doc.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::array<unsigned char, 8> len{};
  std::uint64_t n = text.size();
  for (std::size_t i = 0; i < 8; ++i, n >>= 8) len[i] = static_cast<unsigned char>(n & 0xff);
  SyncedFile f(path);
  f.write(std::as_bytes(std::span(len)));
  f.write(std::as_bytes(std::span(text)));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!sizes[i]) continue;
    const std::span<const std::byte> b = bytes_of(i, sizes[i]);
    if (b.size() != sizes[i])
      detail::bad(
          path,
          cat("tensor \"", tensors[i].name, "\" came with ", b.size(), " bytes; its dtype and shape need ", sizes[i]),
          "give each tensor the bytes of its shape");
    f.write(b);
  }
  return f.finish();
}

// Writes a safetensors file of tensors held in memory (write_streamed, each tensor's bytes from its
// data).
inline Digest write(const std::string& path, std::span<const TensorData> tensors,
                    const std::map<std::string, std::string>& metadata = {}) {
  return write_streamed(path, tensors, metadata, [&](std::size_t i, std::uint64_t bytes) {
    return std::span<const std::byte>(static_cast<const std::byte*>(tensors[i].data), static_cast<std::size_t>(bytes));
  });
}

}  // namespace weft::checkpoint
