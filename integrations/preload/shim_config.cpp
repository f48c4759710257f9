// shim_config.cpp — environment and the per-library caller decision (see header).
#include "shim_config.hpp"

#include <dlfcn.h>
#include <strings.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "api/runtime.hpp"
#include "real_symbols.hpp"
#include "tagmem/tagmem_preload.h"

namespace tagmem::preload {
namespace {

std::vector<std::string> split(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (; *s; ++s) {
    if (*s == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += *s;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// torch_memory_saver's reading of a boolean variable: "1" or "true" in any case.
bool truthy(const char* v) { return v && (std::strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0); }

struct decision {
  const void* base;
  bool record;
};

std::mutex g_mutex;
decision g_cache[64];  // libraries seen so far; a lookup is rare, a scan is cheap
int g_cached = 0;

}  // namespace

const shim_config& config() {
  static const shim_config* cfg = [] {
    auto* c = new shim_config;
    if (const char* t = option_text(option::PRELOAD_TAG); *t) {
      c->default_tag = t;
    } else if (truthy(std::getenv("TMS_INIT_ENABLE"))) {
      c->default_tag = "default";  // torch_memory_saver's "every cudaMalloc is pausable"
    }
    c->driver_callers = split(option_text(option::PRELOAD_DRIVER_CALLERS));
    for (const auto& s : c->driver_callers) c->all_callers |= s == "*";
    c->log = option_flag(option::PRELOAD_LOG);
    return c;
  }();
  return *cfg;
}

bool records_driver_calls_of(const void* caller) {
  Dl_info info{};
  if (!caller || !dladdr(caller, &info)) return false;
  std::lock_guard lock(g_mutex);
  for (int i = 0; i < g_cached; ++i)
    if (g_cache[i].base == info.dli_fbase) return g_cache[i].record;
  bool record = false;
  if (!inside_shim(caller)) {
    const char* path = info.dli_fname ? info.dli_fname : "";
    record = config().all_callers;
    for (const auto& piece : config().driver_callers)
      record |= std::strstr(path, piece.c_str()) != nullptr;
    if (config().log) {
      std::fprintf(stderr, "[tagmem preload] driver lookups of %s: %s\n", *path ? path : "(main)",
                   record ? "recorded in the nccl tag" : "passed through");
    }
  }
  if (g_cached < 64) g_cache[g_cached++] = {info.dli_fbase, record};
  return record;
}

}  // namespace tagmem::preload

extern "C" __attribute__((visibility("default"))) const char* tagmem_preload_default_tag(void) {
  const std::string& tag = tagmem::preload::config().default_tag;
  return tag.empty() ? nullptr : tag.c_str();
}
