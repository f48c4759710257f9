// tag_scope.cpp — a thread-local stack of tag names (see tag_scope.hpp).
#include "api/tag_scope.hpp"

#include "base/error.hpp"
#include "host/metadata_heap.hpp"
#include "registry/registry.hpp"

namespace tagmem {
namespace {

meta_vector<meta_string>& stack() {
  thread_local meta_vector<meta_string> s;
  return s;
}

}  // namespace

void push_tag(const char* name) {
  check_tag_name(name);
  stack().emplace_back(name);
}

void pop_tag() {
  TAGMEM_EXPECTS(!stack().empty(), TAGMEM_ERROR_SCOPE_EMPTY,
                 "tagmem_pop_tag() without a matching tagmem_push_tag()");
  stack().pop_back();
}

bool scope_empty() noexcept { return stack().empty(); }

const char* current_tag() noexcept {
  auto& s = stack();
  return s.empty() ? TAGMEM_DEFAULT_TAG : s.back().c_str();
}

}  // namespace tagmem
