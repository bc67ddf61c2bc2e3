// weft::Error, the one exception type of the library.
//
// Every message reads "<where>: <what is wrong>; <how to fix>", with the offending values in <what>.
// The three parts are kept separately as well, so tests can check each one and callers can re-wrap
// an error with more context without parsing text. An error raised inside a model's named parts
// carries their path (Error::within: "h1.mlp.fc", as its parameters are named), which the message
// leads with: "h1.mlp.fc: <where>: <what is wrong>; <how to fix>". Library code never calls exit() or abort() and
// never asserts on user input: it throws weft::Error.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace weft {

class Error : public std::runtime_error {
 public:
  Error(std::string where, std::string what, std::string fix)
      : std::runtime_error(compose(where, what, fix)),
        where_(std::move(where)),
        what_(std::move(what)),
        fix_(std::move(fix)) {}

  const std::string& where() const noexcept { return where_; }
  const std::string& problem() const noexcept { return what_; }
  const std::string& fix() const noexcept { return fix_; }
  const std::string& path() const noexcept { return path_; }  // the named parts it was raised in, or empty

  // The same error raised inside the named part `part` (a layer "fc", then "mlp", then a block
  // "h1"): its path becomes part.path.
  Error within(std::string_view part) const {
    std::string path(part);
    if (!path_.empty()) path += "." + path_;
    return Error(where_, what_, fix_, std::move(path));
  }

 private:
  Error(std::string where, std::string what, std::string fix, std::string path)
      : std::runtime_error(compose(path + ": " + where, what, fix)),
        where_(std::move(where)),
        what_(std::move(what)),
        fix_(std::move(fix)),
        path_(std::move(path)) {}
  static std::string compose(const std::string& where, const std::string& what, const std::string& fix) {
    std::string s = where + ": " + what;
    if (!fix.empty()) s += "; " + fix;
    return s;
  }
  std::string where_, what_, fix_, path_;
};

// cat(a, b, c): the arguments streamed into one string, for building messages with values in them.
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Joins a range with a separator: join(std::vector{1, 2, 4}, ", ") == "1, 2, 4".
template <class Range>
std::string join(const Range& r, std::string_view sep = ", ") {
  std::ostringstream os;
  bool first = true;
  for (const auto& x : r) {
    if (!first) os << sep;
    os << x;
    first = false;
  }
  return os.str();
}

}  // namespace weft
