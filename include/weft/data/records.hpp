// Record files: fixed-shape samples of one element type (float latents or images, labels,
// timesteps), for models whose inputs are not tokens (docs/training.md, "Data formats").
//
//   bytes 0 .. 7     magic "WEFTRECS"
//   8 .. 11          version, uint32 (1)
//   12 .. 15         the element type, uint32: 0 f64, 1 f32, 2 bf16, 4 i32, 5 i64 (core/dtype.hpp's DType)
//   16 .. 19         the rank of a sample, uint32, 1 to 8
//   20 .. 23         zero
//   24 .. 87         a sample's dims, 8 int64 (those past the rank zero)
//   88 .. 95         the number of samples, int64
//   96 .. 255        zero
//   256 ..           the samples, each row-major, one after another; everything little-endian
//
// The file is memory-mapped and validated when opened, before anything reads it: a regular file,
// the header whole, magic, version, a known element type, a rank in range, positive dims, zeros
// where the header keeps them, a size that matches the header exactly ("truncated", or "trailing
// bytes"), and the sample the model declares (its shape and element type) equal to the file's.
// Each failure is a weft::Error naming the file, what was expected and what was found.
//
// RecordLoader<T> reads them as data::Loader reads token sequences: step s of a global batch of B
// samples reads samples s B .. s B + B - 1 (modulo the file's count: each pass over the file is an
// epoch in the same order), data rank d its contiguous B / dp of them; the step is all its state
// (position(), seek()), so a resumed run reads what an uninterrupted one would.
//
// defines: data::RecordFile, data::RecordLoader, data::kRecordMagic
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/core/files.hpp"
#include "weft/core/shape.hpp"

namespace weft::data {

inline constexpr char kRecordMagic[8] = {'W', 'E', 'F', 'T', 'R', 'E', 'C', 'S'};
inline constexpr std::uint32_t kRecordVersion = 1;
inline constexpr std::size_t kRecordHeader = 256;
inline constexpr int kRecordMaxRank = 8;

// What a model reads from a record file: one sample's shape and element type.
struct RecordShape {
  DType dtype = DType::f32;
  std::vector<std::int64_t> dims;  // one sample, e.g. {4, 32, 32} for a latent
};

namespace detail {
inline std::string dims_text(std::span<const std::int64_t> dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += cat(i ? ", " : "", dims[i]);
  return s + ")";
}
inline bool known_dtype(std::uint32_t code) {
  return code == static_cast<std::uint32_t>(DType::f64) || code == static_cast<std::uint32_t>(DType::f32) ||
         code == static_cast<std::uint32_t>(DType::bf16) || code == static_cast<std::uint32_t>(DType::i32) ||
         code == static_cast<std::uint32_t>(DType::i64);
}
}  // namespace detail

class RecordFile {
 public:
  // Opens and validates `path`, whose samples must be `want` (the model's declaration).
  RecordFile(const std::string& path, const RecordShape& want) : path_(path) {
    const std::string where = cat("RecordFile(", path, ")");
    (void)require_regular_file(path, where, "a record file");
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);  // never waits, even if the path became a FIFO
    if (fd_ < 0) throw Error(where, cat("cannot open the file: ", std::strerror(errno)), "check the path");
    struct stat st{};
    if (::fstat(fd_, &st) != 0) fail(where, cat("cannot stat the file: ", std::strerror(errno)), "check the file");
    if (!S_ISREG(st.st_mode))
      fail(where, cat("the path is ", file_kind(st), ", not a regular file"), "give a record file");
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ < kRecordHeader)
      fail(where, cat("the file has ", size_, " bytes, fewer than the ", kRecordHeader, "-byte header"),
           "the file is truncated or not a record file");
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) fail(where, cat("cannot map the file: ", std::strerror(errno)), "check the file");
    map_ = p;
    read_header(where);
    if (dtype_ != want.dtype || dims_ != want.dims)
      fail(where,
           cat("the file's samples are ", detail::dims_text(dims_), " ", name(dtype_), "; the model reads ",
               detail::dims_text(want.dims), " ", name(want.dtype)),
           "write the records in the shape and type the model declares, or declare the file's");
  }
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;
  ~RecordFile() { close(); }

  std::int64_t size() const { return count_; }  // samples
  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& dims() const { return dims_; }
  std::int64_t sample_elements() const { return elements_; }
  const std::string& path() const { return path_; }
  // Sample k's bytes (k < size()).
  std::span<const std::byte> sample(std::int64_t k) const {
    const std::size_t n = static_cast<std::size_t>(elements_) * size_of(dtype_);
    return {static_cast<const std::byte*>(map_) + kRecordHeader + static_cast<std::size_t>(k) * n, n};
  }

  // Writes `count` samples of `dims` and `dtype` from `data` (count x the sample's bytes), for tools
  // and tests.
  static void write(const std::string& path, DType dtype, std::span<const std::int64_t> dims, std::int64_t count,
                    std::span<const std::byte> data) {
    const std::string where = cat("RecordFile::write(", path, ")");
    if (dims.empty() || dims.size() > static_cast<std::size_t>(kRecordMaxRank))
      throw Error(where, cat("a sample of rank ", dims.size()), cat("use 1 to ", kRecordMaxRank, " dims"));
    std::int64_t n = 1;
    for (std::int64_t d : dims) n *= d;
    if (static_cast<std::size_t>(n * count) * size_of(dtype) != data.size())
      throw Error(where,
                  cat(data.size(), " bytes for ", count, " samples of ", detail::dims_text(dims), " ", name(dtype)),
                  "give count x the sample's bytes");
    std::array<unsigned char, kRecordHeader> h{};
    std::memcpy(h.data(), kRecordMagic, 8);
    const auto put32 = [&](std::size_t at, std::uint32_t v) { std::memcpy(h.data() + at, &v, 4); };
    const auto put64 = [&](std::size_t at, std::int64_t v) { std::memcpy(h.data() + at, &v, 8); };
    put32(8, kRecordVersion);
    put32(12, static_cast<std::uint32_t>(dtype));
    put32(16, static_cast<std::uint32_t>(dims.size()));
    for (std::size_t i = 0; i < dims.size(); ++i) put64(24 + 8 * i, dims[i]);
    put64(88, count);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw Error(where, "cannot create the file", "check the directory");
    const bool ok =
        std::fwrite(h.data(), 1, h.size(), f) == h.size() && std::fwrite(data.data(), 1, data.size(), f) == data.size();
    if (std::fclose(f) != 0 || !ok) throw Error(where, "writing failed", "check the disk space");
  }

 private:
  void read_header(const std::string& where) {
    const auto* h = static_cast<const unsigned char*>(map_);
    const auto get32 = [&](std::size_t at) {
      std::uint32_t v;
      std::memcpy(&v, h + at, 4);
      return v;
    };
    const auto get64 = [&](std::size_t at) {
      std::int64_t v;
      std::memcpy(&v, h + at, 8);
      return v;
    };
    if (std::memcmp(h, kRecordMagic, 8) != 0)
      fail(where, "the first 8 bytes are not \"WEFTRECS\"", "this is not a record file");
    if (get32(8) != kRecordVersion)
      fail(where, cat("version ", get32(8), ", expected ", kRecordVersion), "write the file in version 1");
    if (!detail::known_dtype(get32(12)))
      fail(where, cat("element type code ", get32(12), " is none of 0 (f64), 1 (f32), 2 (bf16), 4 (i32), 5 (i64)"),
           "the header is corrupt");
    dtype_ = static_cast<DType>(get32(12));
    const std::uint32_t rank = get32(16);
    if (rank < 1 || rank > static_cast<std::uint32_t>(kRecordMaxRank))
      fail(where, cat("a sample of rank ", rank), cat("the header is corrupt (a rank is 1 to ", kRecordMaxRank, ")"));
    std::int64_t elements = 1;
    for (std::uint32_t i = 0; i < static_cast<std::uint32_t>(kRecordMaxRank); ++i) {
      const std::int64_t d = get64(24 + 8 * i);
      if (i >= rank) {
        if (d != 0) fail(where, cat("dim ", i, " past the rank ", rank, " is ", d, ", not 0"), "the header is corrupt");
        continue;
      }
      if (d < 1 || d > (std::int64_t{1} << 40) || elements > (std::int64_t{1} << 40) / d)
        fail(where, cat("dim ", i, " of a sample is ", d),
             "the header is corrupt (dims are 1 to 2^40 elements in all)");
      elements *= d;
      dims_.push_back(d);
    }
    const std::int64_t count = get64(88);
    if (count < 0) fail(where, cat("sample count ", count, " is negative"), "the header is corrupt");
    if (get32(20) != 0)
      fail(where, cat("reserved header word at byte 20 is ", get32(20), ", not 0"), "the header is corrupt");
    for (std::size_t at = 96; at < kRecordHeader; ++at)
      if (h[at] != 0)
        fail(where, cat("reserved header byte ", at, " is ", int{h[at]}, ", not 0"),
             "the header is corrupt, or the file is of a later format version");
    const auto bytes = static_cast<std::uint64_t>(elements) * size_of(dtype_);
    const std::uint64_t room = std::numeric_limits<std::uint64_t>::max() / 2;
    if (count > 0 && bytes > room / static_cast<std::uint64_t>(count))
      fail(where, cat(count, " samples of ", bytes, " bytes"), "the header is corrupt");
    const std::uint64_t expect = kRecordHeader + bytes * static_cast<std::uint64_t>(count);
    if (expect != size_)
      fail(where,
           cat("the header counts ", count, " samples of ", detail::dims_text(dims_), " ", name(dtype_), " (", expect,
               " bytes with the header) but the file has ", size_, " bytes"),
           expect > size_ ? "the file is truncated" : "the file has trailing bytes; rewrite it");
    count_ = count;
    elements_ = elements;
  }
  [[noreturn]] void fail(const std::string& where, const std::string& what, const std::string& fix) {
    close();
    throw Error(where, what, fix);
  }
  void close() {
    if (map_) ::munmap(map_, size_);
    if (fd_ >= 0) ::close(fd_);
    map_ = nullptr;
    fd_ = -1;
  }

  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  DType dtype_ = DType::f32;
  std::vector<std::int64_t> dims_;
  std::int64_t count_ = 0, elements_ = 0;
};

// Deterministic batches of records over the data axis (the header's comment says which samples).
template <Element T>
class RecordLoader {
 public:
  RecordLoader(const RecordFile& file, std::int64_t global_batch, int data_degree, int data_index)
      : file_(&file), B_(global_batch), dp_(data_degree), index_(data_index) {
    const std::string where = cat("RecordLoader(", file.path(), ")");
    if (file.dtype() != dtype_of<T>)
      throw Error(where, cat("the file holds ", name(file.dtype()), ", the loader reads ", name(dtype_of<T>)),
                  "read the file with the element type it holds");
    if (file.size() < 1) throw Error(where, "the file holds no samples", "write at least one sample");
    if (global_batch < 1 || data_degree < 1 || data_index < 0 || data_index >= data_degree ||
        global_batch % data_degree != 0)
      throw Error(where, cat("global batch ", global_batch, ", data rank ", data_index, " of ", data_degree),
                  "use a positive global batch divisible by the data degree");
  }

  std::int64_t local_batch() const { return B_ / dp_; }

  // Fills this rank's (B / dp, sample...) values, row-major, and advances one step.
  void next(std::vector<T>& out) {
    const std::int64_t b = local_batch(), n = file_->sample_elements();
    out.resize(static_cast<std::size_t>(b * n));
    for (std::int64_t i = 0; i < b; ++i) {
      const auto k =
          static_cast<std::uint64_t>(step_ * B_ + index_ * b + i) % static_cast<std::uint64_t>(file_->size());
      const std::span<const std::byte> s = file_->sample(static_cast<std::int64_t>(k));
      std::memcpy(out.data() + i * n, s.data(), s.size());
    }
    ++step_;
  }

  std::int64_t position() const { return step_; }
  void seek(std::int64_t step) {
    const std::int64_t most = std::numeric_limits<std::int64_t>::max() / B_ - 1;
    if (step < 0 || step > most)
      throw Error("RecordLoader::seek", cat("step ", step, " with a global batch of ", B_),
                  cat("use a step in [0, ", most, "]"));
    step_ = step;
  }

 private:
  const RecordFile* file_;
  std::int64_t B_;
  int dp_, index_;
  std::int64_t step_ = 0;
};

}  // namespace weft::data
