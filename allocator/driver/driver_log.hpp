// driver_log.hpp — TAGMEM_LOG=debug: every CUDA driver call tagmem makes, one line each.
//
// The driver table (driver/driver.hpp) is the only door to CUDA, so wrapping its entries when
// the driver loads covers every call: the wrapper times the call and logs its name, arguments
// (numbers, and pointers as addresses), result and microseconds. Without debug the table holds
// the driver's own functions and nothing is added.
#pragma once

#include "driver/driver.hpp"

namespace tagmem::driver {

// Replaces every entry of `t` with a logging wrapper around it (once; later calls do nothing).
void log_driver_calls(table& t);

}  // namespace tagmem::driver
