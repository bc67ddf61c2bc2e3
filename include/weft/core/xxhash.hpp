// xxHash (libxxhash-dev), header-only: the one place weft includes it (XXH3-64 for checkpoint files
// and the start-up fingerprint), so that every translation unit compiles it the same way.
#pragma once

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL  // no library to link
#endif
#include <xxhash.h>
