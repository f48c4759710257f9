// error.cpp — the throwing half of the error idiom (see error.hpp).
#include "base/error.hpp"

namespace tagmem {

void fail(tagmem_status code, const std::string& message) { throw error(code, message); }

}  // namespace tagmem
