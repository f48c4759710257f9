// clock_page_state.hpp — the release clock's page (Note [clock page] in
// allocator/device/clock_page.hpp) in each state another process may leave it in, for the fault
// sweep and the fuzzer. Whatever the state, every byte must come back; only which engine copies
// may change.
#pragma once

namespace tagmem::test {

enum class clock_page_state : int {
  none = 0,       // no page: the process keeps its own clock
  fresh = 1,      // a page of its own, as tagmem makes it
  hostile = 2,    // holding INT64_MAX (the far future): every reload counts as after a release
  truncated = 3,  // cut to nothing while in use
};
inline constexpr int kClockPageStates = 4;

// Forgets every release and shares the release clock through a page of this process's own, left
// in `state`; its name is unlinked at once, so nothing is left in /dev/shm (the open page goes on
// working). With `none`, or where the page is refused, the process keeps its own clock.
void use_clock_page(clock_page_state state);

}  // namespace tagmem::test
