// fork_guard.hpp — what a process forked after tagmem started gets from tagmem: an error.
//
// Note [fork]: fork() copies only the calling thread. tagmem's other threads (background
// pinning, the release queues, pinning helpers, the NCCL rendezvous) do not exist in the child,
// yet the child inherits their state: mutexes they held stay locked forever, and conditions that
// only they would make true (pinning stopped, releases done) never become true, so the first call
// that waits for them hangs. CUDA itself does not work in such a child either. So once tagmem has
// begun loading the driver, a pthread_atfork handler marks every child as forked, and every C
// entry point of the child returns TAGMEM_ERROR_FORKED before it touches a lock, a thread or the
// driver. The registry is left as it was (it cannot be torn down without those threads and that
// driver); the child's exit does not touch it. A process forked before tagmem started, or one
// started with exec, uses tagmem normally.
#pragma once

#include <string>

namespace tagmem {

// Marks tagmem as started in this process (the first call installs the fork handler). Cheap after
// the first call; thread-safe.
void mark_started();

// Whether this process is a child forked after tagmem started in its parent.
bool forked_after_start() noexcept;

// The message the child's calls fail with.
std::string forked_message();

}  // namespace tagmem
