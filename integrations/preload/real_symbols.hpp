// real_symbols.hpp — the functions the shim stands in front of: glibc's dlsym/dlvsym and the
// CUDA runtime's allocation calls.
//
// Note [real dlsym]: the shim exports dlsym and dlvsym, and an unversioned definition satisfies
// every versioned reference (dlsym@GLIBC_2.2.5 and @GLIBC_2.34 alike), so any call the shim
// makes to "dlvsym" — even dlvsym(RTLD_NEXT, ...) — lands in the shim again. The one way out
// that needs no private glibc symbol is to read libc's own dynamic symbol table: find libc in
// the dynamic linker's object list (_r_debug), look "dlvsym" up through its GNU hash table and
// version definitions, and call that. With it, dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34") (then
// "GLIBC_2.2.5") gives the next dlsym after the shim, usually glibc's, and likewise for dlvsym.
// This runs no allocation and takes no lock of ours, so it is safe from the very first dlsym call,
// before our constructor.
#pragma once

// Code on the path of every dlsym call. It may run inside another library's start-up — a
// sanitizer runtime resolves its interceptors with dlsym before its shadow memory exists — so
// it is never instrumented, and it calls no function another library may intercept (not even
// strcmp): only plain loads and stores, and the helpers below. no_sanitize leaves ThreadSanitizer's
// function entry and exit hooks in place, which crash before its runtime is set up (the first
// dlsym of a TSan process comes from the runtime's own initialisation); clang's
// disable_sanitizer_instrumentation removes those, but in clang 14 not ASan's stack frames, so
// both are given.
#if defined(__has_attribute) && __has_attribute(disable_sanitizer_instrumentation)
#define TAGMEM_PRELOAD_EARLY \
  __attribute__((no_sanitize("address", "thread", "undefined"), disable_sanitizer_instrumentation))
#else
#define TAGMEM_PRELOAD_EARLY __attribute__((no_sanitize("address", "thread", "undefined")))
#endif

namespace tagmem::preload {

TAGMEM_PRELOAD_EARLY inline bool same_string(const char* a, const char* b) noexcept {
  for (; *a && *a == *b; ++a, ++b) {
  }
  return *a == *b;
}

// Whether `s` starts with `prefix`.
TAGMEM_PRELOAD_EARLY inline bool starts_with(const char* s, const char* prefix) noexcept {
  for (; *prefix; ++s, ++prefix)
    if (*s != *prefix) return false;
  return true;
}

using dlsym_fn = void* (*)(void*, const char*);
using dlvsym_fn = void* (*)(void*, const char*, const char*);

// Never null once the process runs on glibc; the shim reports and aborts otherwise (it cannot
// offer dlsym at all without them).
TAGMEM_PRELOAD_EARLY dlsym_fn real_dlsym() noexcept;
TAGMEM_PRELOAD_EARLY dlvsym_fn real_dlvsym() noexcept;

// The CUDA runtime function `name` as the code at `caller` would see it without the shim: the
// next definition after the shim in the global scope, else the one in the caller's own loading
// scope (libraries opened with RTLD_LOCAL, such as PyTorch's, keep libcudart there). Null if
// neither has it.
void* next_runtime_symbol(const char* name, const void* caller) noexcept;

// Whether `address` lies inside the shim itself.
bool inside_shim(const void* address) noexcept;

}  // namespace tagmem::preload
