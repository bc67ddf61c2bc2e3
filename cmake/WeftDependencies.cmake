# Host dependencies of weft::weft, from Debian's packages (libeigen3-dev, nlohmann-json3-dev: the
# JSON of checkpoint headers and manifests).
find_package(Threads REQUIRED)
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(nlohmann_json 3 REQUIRED)
# xxHash (libxxhash-dev): checkpoint files' hashes, used header-only (XXH_INLINE_ALL).
find_path(WEFT_XXHASH_INCLUDE_DIR xxhash.h)
if(NOT WEFT_XXHASH_INCLUDE_DIR)
  message(FATAL_ERROR "weft: xxhash.h not found; install Debian's libxxhash-dev (apt-get install libxxhash-dev)")
endif()

# Warnings for weft's own targets (tests add -Werror). GCC 12 reports false -Wmaybe-uninitialized
# warnings inside Eigen's AVX-512 kernels when built with -march=native (the release preset); they
# are not in weft's code, so that one warning is off for GCC.
set(WEFT_WARNINGS -Wall -Wextra -Wpedantic $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)
