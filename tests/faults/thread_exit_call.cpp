// thread_exit_call.cpp — tagmem_free from a thread's exit (see header).
#include "thread_exit_call.hpp"

#include <pthread.h>

#include <thread>

namespace tagmem::reliability {

tagmem_status free_at_thread_exit(void* ptr, tagmem_stream stream, bool use_first,
                                  std::string& message, const char* scope_tag) {
  struct job {
    void* ptr;
    tagmem_stream stream;
    tagmem_status status = TAGMEM_SUCCESS;
    std::string message;
    void failed(tagmem_status s) {
      status = s;
      message = tagmem_last_error();
    }
  };
  static pthread_key_t key;
  static const bool made = pthread_key_create(&key, [](void* v) {
                             job* j = static_cast<job*>(v);
                             const tagmem_status s = tagmem_free(j->ptr, j->stream);
                             if (s != TAGMEM_SUCCESS) j->failed(s);
                           }) == 0;
  if (!made) {
    message = "pthread_key_create failed";
    return TAGMEM_ERROR_INTERNAL;
  }
  job j{ptr, stream, TAGMEM_SUCCESS, {}};
  std::thread t([&] {
    if (use_first) {
      tagmem_status s = tagmem_push_tag(scope_tag);
      if (s == TAGMEM_SUCCESS) s = tagmem_pop_tag();
      if (s != TAGMEM_SUCCESS) return j.failed(s);
    }
    pthread_setspecific(key, &j);
  });
  t.join();
  message = j.message;
  return j.status;
}

}  // namespace tagmem::reliability
