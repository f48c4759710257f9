// tag_scope.hpp — the calling thread's stack of current tags (tagmem_push_tag/pop_tag).
#pragma once

namespace tagmem {

void push_tag(const char* name);     // throws INVALID_ARGUMENT
void pop_tag();                      // throws SCOPE_EMPTY
const char* current_tag() noexcept;  // TAGMEM_DEFAULT_TAG when the stack is empty
bool scope_empty() noexcept;         // nothing pushed on this thread (the preload shim asks)

}  // namespace tagmem
