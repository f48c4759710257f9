// real_symbols.cpp — finding glibc's dlvsym in its symbol table, and the next definitions of
// interposed functions (see Note [real dlsym]).
#include "real_symbols.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tagmem::preload {
namespace {

TAGMEM_PRELOAD_EARLY std::uint32_t gnu_hash(const char* s) {
  std::uint32_t h = 5381;
  for (; *s; ++s) h = h * 33 + static_cast<unsigned char>(*s);
  return h;
}

struct lookup {
  const char* name;
  const char* version;  // the exact version wanted
  void* found = nullptr;
};

// glibc relocates dynamic-section pointers in place on most targets; accept both forms.
TAGMEM_PRELOAD_EARLY ElfW(Addr) absolute(ElfW(Addr) base, ElfW(Addr) p) {
  return p < base ? base + p : p;
}

// Looks `q` up in one loaded object (libc) through DT_GNU_HASH and DT_VERSYM/DT_VERDEF.
TAGMEM_PRELOAD_EARLY void find_in_object(ElfW(Addr) base, const ElfW(Dyn) * dyn, lookup* q) {
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const std::uint32_t* gnu = nullptr;
  const ElfW(Half)* versym = nullptr;
  const char* verdef = nullptr;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB:
        symtab = reinterpret_cast<const ElfW(Sym)*>(absolute(base, d->d_un.d_ptr));
        break;
      case DT_STRTAB:
        strtab = reinterpret_cast<const char*>(absolute(base, d->d_un.d_ptr));
        break;
      case DT_GNU_HASH:
        gnu = reinterpret_cast<const std::uint32_t*>(absolute(base, d->d_un.d_ptr));
        break;
      case DT_VERSYM:
        versym = reinterpret_cast<const ElfW(Half)*>(absolute(base, d->d_un.d_ptr));
        break;
      case DT_VERDEF:
        verdef = reinterpret_cast<const char*>(absolute(base, d->d_un.d_ptr));
        break;
      default:
        break;
    }
  }
  if (!symtab || !strtab || !gnu || !versym || !verdef) return;
  const std::uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
  const std::uint32_t* buckets = reinterpret_cast<const std::uint32_t*>(
      reinterpret_cast<const ElfW(Addr)*>(gnu + 4) + bloom_size);
  const std::uint32_t* chain = buckets + nbuckets;
  const std::uint32_t h = gnu_hash(q->name);
  std::uint32_t idx = buckets[h % nbuckets];
  if (idx < symoffset) return;
  for (;; ++idx) {
    const std::uint32_t ch = chain[idx - symoffset];
    if ((ch | 1) == (h | 1) && same_string(strtab + symtab[idx].st_name, q->name) &&
        symtab[idx].st_value != 0) {
      const unsigned ndx = versym[idx] & 0x7fff;
      for (const char* v = verdef;;) {
        const auto* vd = reinterpret_cast<const ElfW(Verdef)*>(v);
        if (vd->vd_ndx == ndx) {
          const auto* aux = reinterpret_cast<const ElfW(Verdaux)*>(v + vd->vd_aux);
          if (same_string(strtab + aux->vda_name, q->version)) {
            q->found = reinterpret_cast<void*>(base + symtab[idx].st_value);
            return;
          }
          break;
        }
        if (vd->vd_next == 0) break;
        v += vd->vd_next;
      }
    }
    if (ch & 1) break;
  }
}

// Walks the dynamic linker's list of loaded objects (_r_debug, which ld.so exports for
// debuggers) rather than calling dl_iterate_phdr: nothing here may be intercepted by another
// preloaded library (a sanitizer runtime asks dlsym for its own real functions before it can
// serve interceptors).
TAGMEM_PRELOAD_EARLY void find_in_libc(lookup* q) {
  for (const link_map* m = _r_debug.r_map; m && !q->found; m = m->l_next) {
    const char* base = m->l_name;
    if (!base || !m->l_ld) continue;
    for (const char* c = m->l_name; *c; ++c)
      if (*c == '/') base = c + 1;
    if (!starts_with(base, "libc.so")) continue;
    find_in_object(m->l_addr, m->l_ld, q);
  }
}

TAGMEM_PRELOAD_EARLY void* libc_symbol(const char* name) {
  static const char* const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
  for (const char* version : versions) {
    lookup q{name, version};
    find_in_libc(&q);
    if (q.found) return q.found;
  }
  return nullptr;
}

[[noreturn]] TAGMEM_PRELOAD_EARLY void cannot_continue(const char* what) {
  static const char msg[] = "[tagmem preload] cannot find the C library's ";
  std::fwrite(msg, 1, sizeof msg - 1, stderr);
  std::fputs(what, stderr);
  std::fputs("; libtagmem_preload.so needs glibc\n", stderr);
  std::abort();
}

dlsym_fn g_dlsym = nullptr;  // written once by resolve(); __atomic builtins, not std::atomic
dlvsym_fn g_dlvsym = nullptr;

TAGMEM_PRELOAD_EARLY void resolve() {
  auto libc_dlvsym = reinterpret_cast<dlvsym_fn>(libc_symbol("dlvsym"));
  if (!libc_dlvsym) cannot_continue("dlvsym");
  // RTLD_NEXT from here: whatever follows the shim (glibc, or another interposer).
  void* next_dlsym = libc_dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!next_dlsym) next_dlsym = libc_dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  void* next_dlvsym = libc_dlvsym(RTLD_NEXT, "dlvsym", "GLIBC_2.34");
  if (!next_dlvsym) next_dlvsym = libc_dlvsym(RTLD_NEXT, "dlvsym", "GLIBC_2.2.5");
  if (!next_dlsym) cannot_continue("dlsym");
  auto v = next_dlvsym ? reinterpret_cast<dlvsym_fn>(next_dlvsym) : libc_dlvsym;
  __atomic_store_n(&g_dlvsym, v, __ATOMIC_RELEASE);
  __atomic_store_n(&g_dlsym, reinterpret_cast<dlsym_fn>(next_dlsym), __ATOMIC_RELEASE);
}

}  // namespace

dlsym_fn real_dlsym() noexcept {
  dlsym_fn f = __atomic_load_n(&g_dlsym, __ATOMIC_ACQUIRE);
  if (!f) {
    resolve();  // idempotent; a race resolves the same values twice
    f = __atomic_load_n(&g_dlsym, __ATOMIC_ACQUIRE);
  }
  return f;
}

dlvsym_fn real_dlvsym() noexcept {
  dlvsym_fn f = __atomic_load_n(&g_dlvsym, __ATOMIC_ACQUIRE);
  if (!f) {
    resolve();
    f = __atomic_load_n(&g_dlvsym, __ATOMIC_ACQUIRE);
  }
  return f;
}

bool inside_shim(const void* address) noexcept {
  Dl_info mine{}, theirs{};
  static const int anchor = 0;
  if (!dladdr(&anchor, &mine) || !dladdr(address, &theirs)) return false;
  return mine.dli_fbase == theirs.dli_fbase;
}

void* next_runtime_symbol(const char* name, const void* caller) noexcept {
  if (void* f = real_dlsym()(RTLD_NEXT, name)) return f;
  Dl_info info{};
  if (!caller || !dladdr(caller, &info) || !info.dli_fname || inside_shim(caller)) return nullptr;
  void* handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) return nullptr;
  void* f = real_dlsym()(handle, name);
  dlclose(handle);
  return f && !inside_shim(f) ? f : nullptr;
}

}  // namespace tagmem::preload
