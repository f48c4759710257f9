// driver.cpp — loads the CUDA driver at run time and fills the entry-point table.
//
// The library is opened with RTLD_NOW|RTLD_LOCAL so that nothing it exports leaks into the
// global namespace, and every entry point comes from cuGetProcAddress_v2 at the toolkit's
// CUDA_VERSION: that returns the ABI cuda.h declares, whatever per-version symbol names the
// driver exports. Note [symbol resolver]: the LD_PRELOAD shim interposes dlsym and hands out
// wrapped driver entry points; tagmem itself must get the real ones, so the shim installs the
// real dlsym here before tagmem loads the driver.
#include "driver.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "base/fork_guard.hpp"
#include "driver/driver_log.hpp"
#include "observe/log.hpp"
#include "options/options.hpp"

namespace tagmem::driver {
namespace {

using get_proc_address_fn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                         CUdriverProcAddressQueryResult*);

table g_table;                          // filled by load(), read-only afterwards
void* g_handle = nullptr;               // dlopen() handle of the driver
std::string g_path;                     // what was opened
std::mutex g_mutex;                     // serialises load()
std::atomic<bool> g_loaded{false};      // load() completed
symbol_resolver g_resolver = &::dlsym;  // Note [symbol resolver]

void resolve_all(get_proc_address_fn get_proc) {
#define TAGMEM_DRIVER_ENTRY(name)                                                         \
  {                                                                                       \
    void* fn = nullptr;                                                                   \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;          \
    CUresult r = get_proc(#name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found); \
    TAGMEM_EXPECTS(r == CUDA_SUCCESS && fn != nullptr, TAGMEM_ERROR_NO_DRIVER,            \
                   "the CUDA driver '" + g_path + "' does not provide " #name " (CUDA " + \
                       std::to_string(CUDA_VERSION) + " ABI); update the driver");        \
    g_table.name = reinterpret_cast<decltype(g_table.name)>(fn);                          \
  }
#include "entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
}

}  // namespace

void set_symbol_resolver(symbol_resolver resolver) {
  std::lock_guard lock(g_mutex);
  g_resolver = resolver ? resolver : &::dlsym;
}

void load() {
  if (g_loaded.load(std::memory_order_acquire)) return;
  mark_started();  // before anything starts: a child forked from here on refuses (Note [fork])
  std::lock_guard lock(g_mutex);
  if (g_loaded.load(std::memory_order_relaxed)) return;
  g_path = option_text(option::LIBCUDA);
  void* handle = dlopen(g_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    fail(TAGMEM_ERROR_NO_DRIVER, "cannot load the CUDA driver '" + g_path +
                                     "': " + (why ? why : "unknown error") +
                                     " (set TAGMEM_LIBCUDA to the driver library to use)");
  }
  auto get_proc = reinterpret_cast<get_proc_address_fn>(g_resolver(handle, "cuGetProcAddress_v2"));
  if (!get_proc) {
    dlclose(handle);
    fail(TAGMEM_ERROR_NO_DRIVER,
         "'" + g_path + "' has no cuGetProcAddress_v2: a CUDA 12+ driver is required");
  }
  g_handle = handle;
  try {
    resolve_all(get_proc);
    check(g_table.cuInit(0), "cuInit");
    if (logging(log_level::debug)) log_driver_calls(g_table);  // TAGMEM_LOG=debug
  } catch (...) {
    g_table = table{};
    dlclose(g_handle);
    g_handle = nullptr;
    throw;
  }
  g_loaded.store(true, std::memory_order_release);
}

const std::string& library_path() { return g_path; }

const table& api() noexcept { return g_table; }

std::string describe(CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (g_table.cuGetErrorName) g_table.cuGetErrorName(result, &name);
  if (g_table.cuGetErrorString) g_table.cuGetErrorString(result, &text);
  std::string out = name ? name : "CUDA error " + std::to_string(static_cast<int>(result));
  if (text) out += std::string(" (") + text + ")";
  return out;
}

void throw_error(CUresult result, const char* call) {
  tagmem_status code =
      result == CUDA_ERROR_OUT_OF_MEMORY ? TAGMEM_ERROR_OUT_OF_MEMORY : TAGMEM_ERROR_DRIVER;
  fail(code, std::string(call) + " failed: " + describe(result));
}

}  // namespace tagmem::driver
