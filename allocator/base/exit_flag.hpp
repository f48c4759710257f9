// exit_flag.hpp — whether the process has begun to exit, for tagmem's background threads: they
// stop at once rather than run on (waiting out a bound, calling the driver) through exit().
#pragma once

namespace tagmem {

// Starts watching (an atexit handler, registered on the first call only). Call it where such a
// thread starts, after whatever joins that thread at exit registered its own handler: atexit
// handlers run in reverse order, so this one then runs first and the join finds it stopping.
void watch_exit() noexcept;
// Whether exit() has begun (false until watch_exit() was called).
bool exiting() noexcept;

}  // namespace tagmem
