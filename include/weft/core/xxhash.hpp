// xxHash (libxxhash-dev), header-only: the one place weft includes it (XXH3-64 for checkpoint files
// and the start-up fingerprint), so that every translation unit compiles it the same way.
#pragma once

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL  // no library to link
#endif
// GCC 12's AVX-512 intrinsics warn "'__Y' is used uninitialized" wherever they are inlined at -O2
// and above (GCC bug 105593, fixed in 13): on an AVX-512 machine every release unit that hashes
// printed six of them. The AVX2 path hashes the same values (xxHash's result does not depend on the
// vector width), fast enough for checkpoints.
#if !defined(XXH_VECTOR) && defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#define XXH_VECTOR 2  // XXH_AVX2
#endif
#include <xxhash.h>
