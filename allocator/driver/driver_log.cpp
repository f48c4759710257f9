// driver_log.cpp — logging wrappers around the driver table (see driver_log.hpp).
#include "driver/driver_log.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <type_traits>

#include "observe/log.hpp"

namespace tagmem::driver {
namespace {

table g_real;  // the driver's functions, set once before the wrappers are installed

enum entry_index : int {
#define TAGMEM_DRIVER_ENTRY(name) k_##name,
#include "driver/entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
};

constexpr const char* kNames[] = {
#define TAGMEM_DRIVER_ENTRY(name) #name,
#include "driver/entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
};

template <class T>
void put(std::string& out, T v) {
  if constexpr (std::is_pointer_v<T>) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", reinterpret_cast<const void*>(v));
    out += buf;
  } else if constexpr (std::is_enum_v<T>) {
    out += std::to_string(static_cast<long long>(v));
  } else if constexpr (std::is_integral_v<T>) {
    out += std::to_string(v);
  } else {
    out += "{...}";
  }
}

template <auto Member, int Index, class Fn>
struct logged;

template <auto Member, int Index, class R, class... A>
struct logged<Member, Index, R (*)(A...)> {
  static R call(A... args) {
    const auto start = std::chrono::steady_clock::now();
    R result = (g_real.*Member)(args...);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    try {
      std::string line = std::string("driver ") + kNames[Index] + "(";
      bool first = true;
      ((line += first ? "" : ", ", first = false, put(line, args)), ...);
      char tail[64];
      std::snprintf(tail, sizeof tail, ") = %d %.1f us", static_cast<int>(result), us);
      log_line(line + tail);
    } catch (...) {  // no memory for the line: the call's result stands
    }
    return result;
  }
};

}  // namespace

void log_driver_calls(table& t) {
  if (g_real.cuInit) return;
  g_real = t;
#define TAGMEM_DRIVER_ENTRY(name) t.name = &logged<&table::name, k_##name, decltype(t.name)>::call;
#include "driver/entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
}

}  // namespace tagmem::driver
