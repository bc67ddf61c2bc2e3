// llm.c token files: a valid file reads back; every truncation, a bad magic, a bad version, a count
// past the end and a token out of range each raise an Error naming the file and the values.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "support/files.hpp"
#include "weft/data/corpus.hpp"
#include "weft/data/token_file.hpp"

using namespace weft;
using test::read_all;
using test::temp_path;
using test::write_all;
using namespace weft::data;

namespace {

struct Fixture {
  std::string path = temp_path("tokens.bin");
  std::vector<std::uint16_t> tokens;
  Fixture() {
    for (int i = 0; i < 100; ++i) tokens.push_back(static_cast<std::uint16_t>((i * 37) % 50));
    TokenFile::write(path, tokens);
  }
  ~Fixture() { std::remove(path.c_str()); }
};

}  // namespace

TEST_CASE("a valid token file maps and reads back") {
  Fixture fx;
  TokenFile f(fx.path, 50);
  CHECK(f.size() == 100);
  CHECK(std::vector<std::uint16_t>(f.tokens().begin(), f.tokens().end()) == fx.tokens);
  CHECK(read_all(fx.path).size() == 1024 + 200);
}

TEST_CASE("every truncation of a token file is refused with the sizes named") {
  Fixture fx;
  const std::vector<char> bytes = read_all(fx.path);
  const std::string cut = temp_path("cut.bin");
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    write_all(cut, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len)));
    try {
      TokenFile f(cut, 50);
      FAIL("a truncation to ", len, " bytes was accepted");
    } catch (const Error& e) {
      const std::string m = e.what();
      CHECK_MESSAGE(m.find("TokenFile(" + cut + ")") == 0, m);
      if (len < 1024)
        CHECK_MESSAGE(m.find(cat("the file has ", len, " bytes, fewer than the 1024-byte header")) != std::string::npos,
                      m);
      else
        CHECK_MESSAGE(m.find(cat("the header counts 100 tokens (1224 bytes with the header) but the file has ", len,
                                 " bytes; the file is truncated")) != std::string::npos,
                      m);
    }
  }
  std::remove(cut.c_str());
}

TEST_CASE("bad magic, bad version, a count past the end, trailing bytes and a token out of range") {
  Fixture fx;
  const std::vector<char> good = read_all(fx.path);
  const std::string bad = temp_path("bad.bin");
  auto with = [&](auto edit) {
    std::vector<char> b = good;
    edit(b);
    write_all(bad, b);
  };
  auto set_int = [](std::vector<char>& b, int index, std::int32_t v) { std::memcpy(b.data() + 4 * index, &v, 4); };
  with([&](auto& b) { set_int(b, 0, 12345); });
  CHECK_THROWS_WITH_AS(TokenFile(bad, 50),
                       doctest::Contains("magic number 12345, expected 20240520; this is not an llm.c token file"),
                       Error);
  with([&](auto& b) { set_int(b, 1, 2); });
  CHECK_THROWS_WITH_AS(TokenFile(bad, 50), doctest::Contains("version 2, expected 1"), Error);
  with([&](auto& b) { set_int(b, 2, 101); });
  CHECK_THROWS_WITH_AS(
      TokenFile(bad, 50),
      doctest::Contains(
          "the header counts 101 tokens (1226 bytes with the header) but the file has 1224 bytes; the file is truncated"),
      Error);
  with([&](auto& b) { b.push_back(0); });
  CHECK_THROWS_WITH_AS(TokenFile(bad, 50), doctest::Contains("the file has trailing bytes"), Error);
  CHECK_THROWS_WITH_AS(TokenFile(fx.path, 40),
                       doctest::Contains("token 48 at position 4 is not below the vocabulary size 40"), Error);
  with([&](auto& b) { set_int(b, 200, -3); });
  CHECK_THROWS_WITH_AS(TokenFile(bad, 50), doctest::Contains("reserved header word 200 is -3, not 0"), Error);
  const std::string missing = temp_path("missing.bin");
  CHECK_THROWS_WITH_AS(TokenFile(missing, 50),
                       doctest::Contains(cat("cannot read '", missing, "': No such file or directory").c_str()), Error);
  std::remove(bad.c_str());
}

TEST_CASE("a directory, a FIFO, a device and an empty text are refused before they are opened, naming the path") {
  const std::string dir = temp_path("dir"), fifo = temp_path("fifo"), empty = temp_path("empty.txt");
  std::filesystem::create_directory(dir);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  write_all(empty, {});
  // Opening the FIFO would wait forever for a writer: these return at once.
  CHECK_THROWS_WITH_AS(TokenFile(dir, 50),
                       doctest::Contains(cat("'", dir, "' is a directory, not a regular file").c_str()), Error);
  CHECK_THROWS_WITH_AS(TokenFile(fifo, 50), doctest::Contains(cat("'", fifo, "' is a FIFO (named pipe)").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(TokenFile("/dev/null", 50), doctest::Contains("'/dev/null' is a character device"), Error);
  CHECK_THROWS_WITH_AS(WindowCorpus::from_text_file(fifo), doctest::Contains("is a FIFO (named pipe)"), Error);
  CHECK_THROWS_WITH_AS(WindowCorpus::from_text_file(dir), doctest::Contains("is a directory"), Error);
  CHECK_THROWS_WITH_AS(WindowCorpus::from_text_file(empty),
                       doctest::Contains(cat("WindowCorpus(", empty, "): the text file is empty").c_str()), Error);
  // Too short for a sequence: the file is named, with the longest sequence it allows.
  write_all(empty, std::vector<char>(100, 'a'));
  CHECK_THROWS_WITH_AS(WindowCorpus::from_text_file(empty).require_windows(64),
                       doctest::Contains(cat("WindowCorpus(", empty,
                                             "): 100 tokens (90 for training, 10 held out) are too few "
                                             "for windows of 64 tokens; use a sequence length of at most 10")
                                             .c_str()),
                       Error);
  std::filesystem::remove(dir);
  std::remove(fifo.c_str());
  std::remove(empty.c_str());
}

TEST_CASE("byte-level tokenizer round trip and corpus windows") {
  const std::string text = "hello, weft! \xe2\x9c\x93 bytes";
  const auto tokens = ByteTokenizer::encode(text);
  CHECK(tokens.size() == text.size());
  CHECK(ByteTokenizer::decode(std::span<const std::uint16_t>(tokens)) == text);
  std::string big;
  for (int i = 0; i < 200; ++i) big += text;
  WindowCorpus corpus(ByteTokenizer::encode(big), 3);
  CHECK(corpus.train_size() == static_cast<std::int64_t>(big.size()) * 9 / 10);
  std::vector<std::int32_t> w(16), w2(16);
  corpus.sequence(5, w.data(), 16);
  corpus.sequence(5, w2.data(), 16);
  CHECK(w == w2);  // random access, deterministic
  // A window is a contiguous piece of the training text.
  const std::string piece = ByteTokenizer::decode(std::span<const std::int32_t>(w));
  CHECK(big.substr(0, static_cast<std::size_t>(corpus.train_size())).find(piece) != std::string::npos);
  CHECK_THROWS_WITH_AS(WindowCorpus(ByteTokenizer::encode("tiny")).require_windows(16),
                       doctest::Contains("too few for windows of 16 tokens"), Error);
}
