// trace_signals.hpp — the trace written when SIGTERM or SIGINT ends the process.
//
// A process stopped by its launcher (SIGTERM from torchrun or a job scheduler, SIGINT from a
// terminal) never reaches the write at exit, and its trace would be lost. When TAGMEM_TRACE names
// a file, tagmem_init installs a handler for both signals (not for one that is ignored). A signal
// handler may not take locks or allocate, and writing the trace does both, so the write happens
// on a thread started for it, which sleeps in read(2) on a pipe: the handler writes a byte to the
// pipe and waits (poll(2), at most kSignalFlushWaitMs) for the thread's answer on a second pipe,
// then does what was done before: calls the previous handler, or restores the default action and
// raises the signal again, so that the process ends by that signal, as it would have. If the
// signal interrupted a thread in the middle of recording an event or of allocating memory, the
// writing thread waits for that thread and the handler stops waiting after kSignalFlushWaitMs:
// the process then ends without the write. A handler installed after tagmem_init replaces this
// one; it can call tagmem_trace_flush itself. A forked child only chains.
#pragma once

namespace tagmem::trace {

constexpr int kSignalFlushWaitMs = 10000;

// Installs the handlers and starts the writing thread, once per process; `write` is what the
// thread calls (flush()). Never throws: without a thread or a pipe, nothing is installed.
void flush_on_signals(void (*write)()) noexcept;

}  // namespace tagmem::trace
