#pragma once
// Whether this test binary, and so the trident built with it, runs under AddressSanitizer
// (scripts/sanitize.sh). ASan reserves terabytes of address space for its shadow memory, so a
// cap on the address space (ulimit -v, RLIMIT_AS) cannot be set under it; and the sanitized
// build's own timing loops (the FMA peak) run slower than a release build's.
namespace trident::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderAddressSanitizer = true;
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif

}  // namespace trident::test
