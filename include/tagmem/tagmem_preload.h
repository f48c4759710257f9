/* tagmem_preload.h — controls that only the LD_PRELOAD shim (libtagmem_preload.so) exports.
 *
 * Under the shim, a cudaMalloc / cudaMallocAsync of a dynamically linked CUDA runtime goes to
 * tagmem when the calling thread is inside a tag scope (tagmem_push_tag), into that tag, or else
 * when TAGMEM_PRELOAD_TAG names a default tag (TMS_INIT_ENABLE=1, torch_memory_saver's variable,
 * makes that "default" when TAGMEM_PRELOAD_TAG is unset). A thread can override this decision for
 * its own calls. Find these functions with dlsym(RTLD_DEFAULT, ...): a process without the shim
 * does not have them.
 */
#ifndef TAGMEM_TAGMEM_PRELOAD_H
#define TAGMEM_TAGMEM_PRELOAD_H

#ifdef __cplusplus
extern "C" {
#endif

#define TAGMEM_PRELOAD_ROUTE_AUTO (-1) /* scopes and the default tag decide (the initial mode) */
#define TAGMEM_PRELOAD_ROUTE_OFF 0     /* this thread's allocations go to the runtime */
#define TAGMEM_PRELOAD_ROUTE_ON 1      /* to tagmem, the current tag ("default" outside scopes) */

/* Sets the calling thread's routing mode and returns the previous one; an unknown mode changes
 * nothing and returns -2. Frees are unaffected: memory goes back to whoever allocated it.
 * Thread-safe (the mode is per thread). */
int tagmem_preload_set_thread_routing(int mode);

/* 1 when a cudaMalloc made by the calling thread now would go to tagmem, else 0. */
int tagmem_preload_thread_routed(void);

/* The tag every cudaMalloc outside a tag scope goes to (TAGMEM_PRELOAD_TAG, or "default" under
 * TMS_INIT_ENABLE=1), or NULL when there is none. Read once at start-up; the string lives as long
 * as the process. Lets control code (the torch_memory_saver drop-in) pause that tag. */
const char* tagmem_preload_default_tag(void);

#ifdef __cplusplus
}
#endif

#endif /* TAGMEM_TAGMEM_PRELOAD_H */
