// external_tag.cpp — the registered external tag (see external_tag.hpp).
#include "tags/external_tag.hpp"

#include <atomic>
#include <cstring>

#include "base/error.hpp"

namespace tagmem {
namespace {
std::atomic<const external_tag*> g_external{nullptr};
}  // namespace

void register_external_tag(const external_tag* t) noexcept { g_external.store(t); }

const external_tag* registered_external_tag() noexcept { return g_external.load(); }

const external_tag* find_external_tag(const char* name) noexcept {
  const external_tag* t = g_external.load();
  return t && name && std::strcmp(t->name, name) == 0 ? t : nullptr;
}

void refuse_external(const external_tag& t, const char* operation) {
  fail(TAGMEM_ERROR_INVALID_ARGUMENT, std::string(operation) + " of tag '" + t.name +
                                          "': its memory is moved only by " + t.moved_by);
}

}  // namespace tagmem
