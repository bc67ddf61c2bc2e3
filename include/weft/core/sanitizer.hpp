// defines: WEFT_ASAN, 1 where the unit is compiled under AddressSanitizer, else 0.
//
// GCC predefines __SANITIZE_ADDRESS__ under -fsanitize=address; Clang does so only from version 22
// and before that answers __has_feature(address_sanitizer). Testing one of them alone compiled the
// allocator's poisoning out of the dev preset's clang 19 build, silently: ask this macro instead.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define WEFT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WEFT_ASAN 1
#endif
#endif
#ifndef WEFT_ASAN
#define WEFT_ASAN 0
#endif
