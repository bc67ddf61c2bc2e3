// safetensors read and written by weft: a round trip, a file built by hand from the format's
// specification, every validation rule on a crafted bad file (each a weft::Error naming the file
// and the values), every truncation of a valid file, and random corruption of its header.
#include <doctest/doctest.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "weft/checkpoint/safetensors.hpp"
#include "weft/core/philox.hpp"

using namespace weft;
using namespace weft::checkpoint;

namespace {

std::string temp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / cat("weft_st_", ::getpid(), "_", name)).string();
}

// A file from raw parts: the header text (as given, length prefixed) and the data bytes.
std::string raw(const std::string& name, const std::string& header, const std::string& data,
                std::uint64_t len_override = 0) {
  const std::string path = temp(name);
  std::ofstream out(path, std::ios::binary);
  std::uint64_t n = len_override ? len_override : header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out.put(static_cast<char>(n & 0xff));
  out << header << data;
  return path;
}

void expect_error(const std::string& path, const std::string& message) {
  std::string what;
  try {
    (void)read_header(path);
  } catch (const Error& e) { what = e.what(); }
  CHECK_MESSAGE(what.find(message) != std::string::npos, "expected \"", message, "\", got \"", what, "\"");
  CHECK_MESSAGE(what.find(cat("safetensors(", path, ")")) == 0, what);
  std::filesystem::remove(path);
}

}  // namespace

TEST_CASE("safetensors: a round trip of f32, bf16 and i64 tensors with metadata") {
  const std::vector<float> a{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  const std::vector<bf16> b{bf16(1.0f), bf16(-0.5f)};
  const std::vector<std::int64_t> c{-1, 1LL << 40, 3};
  const std::vector<TensorData> ts{{"h0.attn.qkv.weight", DType::f32, {2, 3}, a.data()},
                                   {"wte", DType::bf16, {2}, b.data()},
                                   {"step", DType::i64, {3}, c.data()},
                                   {"empty", DType::f32, {0, 4}, nullptr}};
  const std::string path = temp("roundtrip.safetensors");
  write(path, ts, {{"format", "weft"}});
  const Header h = read_header(path);
  REQUIRE(h.tensors.size() == 4);
  CHECK(h.metadata.at("format") == "weft");
  CHECK((h.data_start - 8) % 8 == 0);  // the header is padded to 8 bytes
  const TensorInfo* qkv = h.find("h0.attn.qkv.weight");
  REQUIRE(qkv);
  CHECK(qkv->dtype == DType::f32);
  CHECK(qkv->shape == std::vector<std::int64_t>{2, 3});
  std::vector<float> a2(6);
  read_bytes(path, h, qkv->begin, qkv->end - qkv->begin, a2.data());
  CHECK(a2 == a);
  std::vector<std::int64_t> c2(3);
  read_bytes(path, h, h.find("step")->begin, 24, c2.data());
  CHECK(c2 == c);
  std::vector<bf16> b2(2);
  read_bytes(path, h, h.find("wte")->begin, 4, b2.data());
  CHECK(b2 == b);
  CHECK(h.find("empty")->end == h.find("empty")->begin);
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: a file built by hand from the specification reads back") {
  // 8-byte little-endian length, the JSON header, then F32 [2] = {1, 2} at offsets [0, 8).
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})";
  float data[2] = {1.0f, 2.0f};
  const std::string path = raw("spec.safetensors", header, std::string(reinterpret_cast<const char*>(data), 8));
  const Header h = read_header(path);
  REQUIRE(h.tensors.size() == 1);
  CHECK(h.tensors[0].name == "x");
  CHECK(h.data_start == 8 + header.size());
  float back[2];
  read_bytes(path, h, 0, 8, back);
  CHECK(back[1] == 2.0f);
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: every validation rule, each an Error naming the file and the values") {
  const std::string d8(8, '\0');
  auto one = [](const std::string& dtype, const std::string& shape, const std::string& off) {
    return cat(R"({"x":{"dtype":)", dtype, R"(,"shape":)", shape, R"(,"data_offsets":)", off, "}}");
  };
  expect_error(temp("missing"), "is not a regular file");
  {  // fewer than 8 bytes
    const std::string p = temp("tiny");
    std::ofstream(p, std::ios::binary) << "abc";
    expect_error(p, "the file has 3 bytes, fewer than the 8-byte header length");
  }
  expect_error(raw("cap", "{}", "", kMaxHeader + 1), "exceeds the 104857600-byte cap");
  expect_error(raw("past", "{}", "", 1000), "the header length 1000 runs past the end of the 10-byte file");
  expect_error(raw("json", "{not json", ""), "the header is not valid UTF-8 JSON");
  expect_error(raw("utf8", "{\"\xff\xfe\":1}", ""), "the header is not valid UTF-8 JSON");
  expect_error(raw("array", "[1,2]", ""), "the header is not a JSON object");
  // Nesting is bounded before the parser sees it (nlohmann_json prints values recursively, as the
  // message about a 100000-deep dtype did: the stack overflowed); brackets inside strings do not count.
  expect_error(raw("deep", std::string(100000, '[') + std::string(100000, ']'), ""),
               "header: nests JSON arrays and objects 9 or more deep, over the limit of 8");
  expect_error(raw("deep_meta", "{\"__metadata__\": {\"a\": [[[[[[[[[1]]]]]]]]]}}", ""),
               "nests JSON arrays and objects 9 or more deep");
  expect_error(raw("deep_dtype",
                   "{\"x\": {\"dtype\": " + std::string(100000, '[') + std::string(100000, ']') +
                       ", \"shape\": [], \"data_offsets\": [0, 0]}}",
                   ""),
               "nests JSON arrays and objects 9 or more deep");
  CHECK(read_header(raw("brackets_in_strings", "{\"__metadata__\": {\"a\": \"[[[[[[[[[[[[[[[[\\\"[[[[[[[[\"}}", ""))
            .metadata.at("a") == "[[[[[[[[[[[[[[[[\"[[[[[[[[");
  expect_error(
      raw("dup",
          R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          d8),
      "the tensor name \"x\" appears twice");
  expect_error(raw("dtype", one("\"Q7\"", "[2]", "[0,8]"), d8), "has dtype \"Q7\"");
  expect_error(raw("rank", one("\"F32\"", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), d8.substr(0, 4)), "at most 8 dims");
  expect_error(raw("neg", one("\"F32\"", "[-2]", "[0,8]"), d8), "a dim -2 that is not a non-negative integer");
  expect_error(raw("overflow", one("\"F32\"", "[4294967296,4294967296]", "[0,8]"), d8), "more elements than 2^64");
  expect_error(raw("mismatch", one("\"F32\"", "[3]", "[0,8]"), d8), "is 12 bytes but its data_offsets [0, 8] hold 8");
  expect_error(raw("offsets", one("\"F32\"", "[2]", "[0]"), d8), "data_offsets that are not two non-negative integers");
  expect_error(raw("reversed", one("\"F32\"", "[0]", "[8,0]"), d8), "data_offsets [8, 0]");
  expect_error(raw("gap", one("\"F32\"", "[1]", "[4,8]"), d8),
               "starts at byte 4 of the data but the one before it ends at 0");
  expect_error(
      raw("overlap",
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          d8),
      "starts at byte 4 of the data but the one before it ends at 8");
  expect_error(raw("trailing", one("\"F32\"", "[1]", "[0,4]"), d8),
               "ends at byte 4 but the file holds 8 bytes of data");
  expect_error(raw("outside", one("\"F32\"", "[4]", "[0,16]"), d8),
               "ends at byte 16 but the file holds 8 bytes of data");
  expect_error(
      raw("name",
          cat(R"({")", std::string(kMaxName + 1, 'n'), R"(":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"), d8),
      "a tensor name of 1025 bytes");
  expect_error(raw("meta", R"({"__metadata__":{"k":1}})", ""), "metadata \"k\" is not a string");
  expect_error(raw("fields", R"({"x":{"dtype":"F32"}})", ""), "lacks dtype, shape or data_offsets");
}

TEST_CASE(
    "safetensors: every truncation of a valid file, and 2000 corrupted headers, give an Error or a valid header") {
  const std::vector<float> a(16, 1.0f);
  const std::vector<TensorData> ts{{"a", DType::f32, {4, 4}, a.data()}, {"b", DType::f32, {8}, a.data()}};
  const std::string path = temp("valid.safetensors");
  write(path, ts);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  int errors = 0;
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    const std::string p = raw("trunc", "", "");
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(len));
    try {
      (void)read_header(p);
    } catch (const Error&) { ++errors; }
    std::filesystem::remove(p);
  }
  CHECK(errors == static_cast<int>(bytes.size()));  // no truncation is a valid file
  int valid = 0, refused = 0;
  for (std::uint64_t k = 0; k < 2000; ++k) {
    std::string b = bytes;
    const auto r = weft::philox(17, 0, k);
    const std::size_t at = r[0] % (bytes.size() - 8 * 4);  // the length prefix and the header
    b[at] = static_cast<char>(r[1] & 0xff);
    const std::string p = temp("fuzz");
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
    try {
      const Header h = read_header(p);
      ++valid;
      std::uint64_t total = 0;
      for (const TensorInfo& t : h.tensors) total = std::max(total, t.end);
      CHECK(h.data_start + total == b.size());  // what validates is consistent with the file
    } catch (const Error&) { ++refused; }
    std::filesystem::remove(p);
  }
  MESSAGE("corrupted headers: ", refused, " refused, ", valid,
          " still valid (the byte changed was in a name, the padding or the data)");
  CHECK(refused + valid == 2000);
  CHECK(refused > 0);
  std::filesystem::remove(path);
}
