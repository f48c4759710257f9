// tag_scope.cpp — a thread-local stack of tag names (see tag_scope.hpp).
#include "api/tag_scope.hpp"

#include "base/error.hpp"
#include "host/metadata_heap.hpp"
#include "registry/registry.hpp"

namespace tagmem {
namespace {

// The stack lives behind a trivially destructible thread_local (Note [heap at thread exit] in
// metadata_heap.cpp): a thread's exit destructors may call tagmem after the stack's own
// destructor ran. From then on the thread has an empty scope again; what a destructor pushes
// there is deleted when popped empty, since no later destructor would delete it.
using tag_stack = meta_vector<meta_string>;
struct scope_state {
  tag_stack* stack = nullptr;
  bool gone = false;  // the thread_local destructor ran
};
constinit thread_local scope_state t_scope;

struct scope_retirer {
  ~scope_retirer() {
    delete t_scope.stack;
    t_scope.stack = nullptr;
    t_scope.gone = true;
  }
};

tag_stack& stack_for_push() {
  if (!t_scope.stack) {
    t_scope.stack = new tag_stack;
    if (!t_scope.gone) {
      thread_local scope_retirer retirer;
      (void)retirer;
    }
  }
  return *t_scope.stack;
}

}  // namespace

void push_tag(const char* name) {
  check_tag_name(name);
  stack_for_push().emplace_back(name);
}

void pop_tag() {
  TAGMEM_EXPECTS(!scope_empty(), TAGMEM_ERROR_SCOPE_EMPTY,
                 "tagmem_pop_tag() without a matching tagmem_push_tag()");
  t_scope.stack->pop_back();
  if (t_scope.gone && t_scope.stack->empty()) {
    delete t_scope.stack;
    t_scope.stack = nullptr;
  }
}

bool scope_empty() noexcept { return !t_scope.stack || t_scope.stack->empty(); }

const char* current_tag() noexcept {
  return scope_empty() ? TAGMEM_DEFAULT_TAG : t_scope.stack->back().c_str();
}

}  // namespace tagmem
