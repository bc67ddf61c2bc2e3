// Record files (data/records.hpp): samples read back exactly (also from tools/records.py's writer),
// batches over data ranks as one rank reads them, a resumed loader as an uninterrupted one; and
// every corruption, truncation and disagreement with the model's declaration refused by name.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "support/files.hpp"
#include "weft/data/records.hpp"

using namespace weft;
using test::read_all;
using test::temp_path;
using test::write_all;
using namespace weft::data;

namespace {

// 5 samples of (2, 3) f32: sample k's element e is 10 k + e.
struct Fixture {
  std::string path = temp_path("records.bin");
  std::vector<float> values;
  const RecordShape shape{DType::f32, {2, 3}};
  Fixture() {
    for (int k = 0; k < 5; ++k)
      for (int e = 0; e < 6; ++e) values.push_back(static_cast<float>(10 * k + e));
    RecordFile::write(path, DType::f32, std::vector<std::int64_t>{2, 3}, 5, std::as_bytes(std::span(values)));
  }
  ~Fixture() { std::filesystem::remove(path); }
  // The file with its bytes changed by f, opened as the model declares `want`.
  template <class F>
  void corrupt(F&& f, const std::string& expect, const RecordShape* want = nullptr) {
    std::vector<char> bytes = read_all(path);
    f(bytes);
    const std::string bad = temp_path("bad-records.bin");
    write_all(bad, bytes);
    INFO(expect);
    CHECK_THROWS_WITH_AS(RecordFile(bad, want ? *want : shape), doctest::Contains(expect.c_str()), Error);
    CHECK_THROWS_WITH_AS(RecordFile(bad, want ? *want : shape), doctest::Contains(bad.c_str()), Error);
    std::filesystem::remove(bad);
  }
};

template <class V>
void put(std::vector<char>& b, std::size_t at, V v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

}  // namespace

TEST_CASE("a record file reads back every sample exactly") {
  Fixture fx;
  const RecordFile f(fx.path, fx.shape);
  CHECK(f.size() == 5);
  CHECK(f.sample_elements() == 6);
  CHECK(f.dtype() == DType::f32);
  for (std::int64_t k = 0; k < 5; ++k) {
    std::vector<float> got(6);
    std::memcpy(got.data(), f.sample(k).data(), f.sample(k).size());
    CHECK(got == std::vector<float>(fx.values.begin() + 6 * k, fx.values.begin() + 6 * k + 6));
  }
}

TEST_CASE("record batches: data ranks split what one rank reads, epochs wrap, a seek resumes exactly") {
  Fixture fx;
  const RecordFile f(fx.path, fx.shape);
  // One rank, global batch 4: step 0 samples 0..3, step 1 samples 4, 0, 1, 2 (the second epoch).
  RecordLoader<float> one(f, 4, 1, 0);
  std::vector<float> s0, s1;
  one.next(s0);
  one.next(s1);
  const auto first = [](const std::vector<float>& v, std::size_t i) { return v[6 * i]; };  // 10 k
  CHECK(std::vector<float>{first(s0, 0), first(s0, 1), first(s0, 2), first(s0, 3)} ==
        std::vector<float>{0, 10, 20, 30});
  CHECK(std::vector<float>{first(s1, 0), first(s1, 1), first(s1, 2), first(s1, 3)} ==
        std::vector<float>{40, 0, 10, 20});
  CHECK(one.position() == 2);
  // Data 2: each rank its contiguous half of the same global batch, bit for bit.
  for (int d = 0; d < 2; ++d) {
    RecordLoader<float> rank(f, 4, 2, d);
    CHECK(rank.local_batch() == 2);
    std::vector<float> a, b;
    rank.next(a);
    rank.next(b);
    CHECK(a == std::vector<float>(s0.begin() + 12 * d, s0.begin() + 12 * d + 12));
    CHECK(b == std::vector<float>(s1.begin() + 12 * d, s1.begin() + 12 * d + 12));
  }
  // A loader moved to step 1 reads what the uninterrupted one read at step 1.
  RecordLoader<float> resumed(f, 4, 1, 0);
  resumed.seek(1);
  std::vector<float> r1;
  resumed.next(r1);
  CHECK(r1 == s1);
  CHECK_THROWS_WITH_AS(resumed.seek(-1), doctest::Contains("step -1 with a global batch of 4"), Error);
}

TEST_CASE("a record file that disagrees with the model's declaration is refused naming both") {
  Fixture fx;
  const RecordShape other{DType::f32, {3, 2}}, wider{DType::f64, {2, 3}};
  CHECK_THROWS_WITH_AS(RecordFile(fx.path, other),
                       doctest::Contains("the file's samples are (2, 3) f32; the model reads (3, 2) f32"), Error);
  CHECK_THROWS_WITH_AS(RecordFile(fx.path, wider),
                       doctest::Contains("the file's samples are (2, 3) f32; the model reads (2, 3) f64"), Error);
  const RecordFile f(fx.path, fx.shape);
  CHECK_THROWS_WITH_AS(RecordLoader<double>(f, 4, 1, 0), doctest::Contains("the file holds f32, the loader reads f64"),
                       Error);
  CHECK_THROWS_WITH_AS(RecordLoader<float>(f, 3, 2, 0),
                       doctest::Contains("global batch 3, data rank 0 of 2; use a positive global batch divisible"),
                       Error);
}

TEST_CASE("truncated, padded and corrupt record files are refused by name with the values") {
  Fixture fx;
  const std::size_t whole = kRecordHeader + 5 * 6 * 4;  // 376 bytes
  fx.corrupt([](auto& b) { b.pop_back(); },
             "the header counts 5 samples of (2, 3) f32 (376 bytes with the header) but the file has 375 bytes; the "
             "file is truncated");
  fx.corrupt([](auto& b) { b.push_back(0); }, "but the file has 377 bytes; the file has trailing bytes");
  fx.corrupt([](auto& b) { b.resize(100); }, "the file has 100 bytes, fewer than the 256-byte header");
  fx.corrupt([](auto& b) { b[0] = 'X'; }, "the first 8 bytes are not \"WEFTRECS\"");
  fx.corrupt([](auto& b) { put(b, 8, std::uint32_t{2}); }, "version 2, expected 1");
  fx.corrupt([](auto& b) { put(b, 12, std::uint32_t{3}); }, "element type code 3 is none of");
  fx.corrupt([](auto& b) { put(b, 16, std::uint32_t{0}); }, "a sample of rank 0");
  fx.corrupt([](auto& b) { put(b, 16, std::uint32_t{9}); }, "a sample of rank 9");
  fx.corrupt([](auto& b) { put(b, 24, std::int64_t{0}); }, "dim 0 of a sample is 0");
  fx.corrupt([](auto& b) { put(b, 32, std::int64_t{-3}); }, "dim 1 of a sample is -3");
  fx.corrupt([](auto& b) { put(b, 24, std::int64_t{1} << 41); }, "dim 0 of a sample is 2199023255552");
  fx.corrupt([](auto& b) { put(b, 40, std::int64_t{7}); }, "dim 2 past the rank 2 is 7, not 0");
  fx.corrupt([](auto& b) { put(b, 88, std::int64_t{-1}); }, "sample count -1 is negative");
  fx.corrupt([](auto& b) { put(b, 88, std::int64_t{1} << 62); }, "samples of 24 bytes; the header is corrupt");
  fx.corrupt([](auto& b) { put(b, 88, std::int64_t{6}); }, "the header counts 6 samples");
  fx.corrupt([](auto& b) { put(b, 20, std::uint32_t{1}); }, "reserved header word at byte 20 is 1, not 0");
  fx.corrupt([](auto& b) { b[200] = 5; }, "reserved header byte 200 is 5, not 0");
  CHECK(read_all(fx.path).size() == whole);

  // Not a regular file; and a file of no samples, which a loader cannot read.
  const std::string dir = temp_path("a-directory");
  std::filesystem::create_directory(dir);
  CHECK_THROWS_WITH_AS(RecordFile(dir, fx.shape), doctest::Contains("is a directory, not a regular file"), Error);
  std::filesystem::remove(dir);
  const std::string empty = temp_path("empty-records.bin");
  RecordFile::write(empty, DType::f32, std::vector<std::int64_t>{2, 3}, 0, {});
  const RecordFile none(empty, fx.shape);
  CHECK(none.size() == 0);
  CHECK_THROWS_WITH_AS(RecordLoader<float>(none, 2, 1, 0), doctest::Contains("the file holds no samples"), Error);
  std::filesystem::remove(empty);
}

TEST_CASE("a record file written by tools/records.py reads back bit for bit") {
  // tests/fixtures/records_f64.bin: tools/records.py --fixture, 3 samples of (2, 2) f64, sample k's
  // element e = k + e / 8, the last three -0.0, 1e300 and 2^-1074 (the smallest subnormal).
  const RecordFile f(std::string(WEFT_TEST_DATA_DIR) + "/records_f64.bin", {DType::f64, {2, 2}});
  REQUIRE(f.size() == 3);
  std::vector<double> want;
  for (int k = 0; k < 3; ++k)
    for (int e = 0; e < 4; ++e) want.push_back(k + e / 8.0);
  want[9] = -0.0;
  want[10] = 1e300;
  want[11] = std::ldexp(1.0, -1074);
  RecordLoader<double> all(f, 3, 1, 0);
  std::vector<double> got;
  all.next(got);
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(double)) == 0);  // -0.0's sign bit too
}
