// private_dir.cpp — finding, creating and checking the rendezvous directory (see header).
#include "private_dir.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "error.hpp"

namespace tagmem::nccl {
namespace {

std::string chosen_path() {
  if (const char* d = std::getenv("TAGMEM_NCCL_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) return std::string(x) + "/tagmem";
  return "/tmp/tagmem-" + std::to_string(::geteuid());
}

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  fail(TAGMEM_ERROR_PEER, "the rendezvous directory '" + path + "' " + why +
                              "; remove it or set TAGMEM_NCCL_DIR to a private directory");
}

}  // namespace

std::string private_dir() {
  std::string path = chosen_path();
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    fail(TAGMEM_ERROR_PEER, "cannot create the rendezvous directory '" + path +
                                "': " + std::strerror(errno) + " (set TAGMEM_NCCL_DIR)");
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    fail(TAGMEM_ERROR_PEER,
         "cannot inspect the rendezvous directory '" + path + "': " + std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) refuse(path, "is a symbolic link");
  if (!S_ISDIR(st.st_mode)) refuse(path, "is not a directory");
  if (st.st_uid != ::geteuid()) {
    refuse(path, "belongs to uid " + std::to_string(st.st_uid) + ", not to this process's uid " +
                     std::to_string(::geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    refuse(path, std::string("has mode ") + mode + ": others may enter it (0700 is required)");
  }
  return path;
}

}  // namespace tagmem::nccl
