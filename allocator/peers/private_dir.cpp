// private_dir.cpp — finding, creating and checking the rendezvous directory (see header).
#include "peers/private_dir.hpp"

#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/error.hpp"
#include "options/options.hpp"

namespace tagmem::peers {
namespace {

pid_t g_chosen_by = 0;  // the process whose load chose TAGMEM_NCCL_DIR, if one did

bool set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

// Runs when the shim loads, before the program's main and before any thread of it exists (so
// setenv is safe here), and before a launcher copies its environment for the ranks it starts.
__attribute__((constructor)) void choose_job_directory() {
  if (option_env(option::PEER_DIR) || option_env(option::NCCL_DIR) || set("XDG_RUNTIME_DIR"))
    return;
  unsigned char random[16];
  if (::getrandom(random, sizeof random, 0) != static_cast<ssize_t>(sizeof random)) return;
  const char* tmp = std::getenv("TMPDIR");
  std::string path = tmp && tmp[0] == '/' ? tmp : "/tmp";
  path += "/tagmem-" + std::to_string(::geteuid()) + "-";
  for (unsigned char b : random) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", b);
    path += hex;
  }
  if (::setenv(spec_of(option::NCCL_DIR).name, path.c_str(), 0) == 0) {
    g_chosen_by = ::getpid();
    note_option_chosen_here(option::NCCL_DIR);
  }
}

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  fail(TAGMEM_ERROR_PEER, "the rendezvous directory '" + path + "' " + why +
                              "; remove it or set TAGMEM_PEER_DIR to a private directory");
}

}  // namespace

bool private_dir_chosen_here() { return g_chosen_by != 0 && g_chosen_by == ::getpid(); }

std::string private_dir() {
  std::string path;
  if (const char* dir = option_env(option::PEER_DIR)) {
    path = dir;
  } else if (const char* nccl = option_env(option::NCCL_DIR)) {
    path = nccl;
  } else if (set("XDG_RUNTIME_DIR")) {
    path = std::string(std::getenv("XDG_RUNTIME_DIR")) + "/tagmem";
  } else {
    fail(TAGMEM_ERROR_INVALID_ARGUMENT,
         "no rendezvous directory: set TAGMEM_PEER_DIR to a directory private to this user and "
         "shared by the job's processes (or XDG_RUNTIME_DIR)");
  }
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    fail(TAGMEM_ERROR_PEER, "cannot create the rendezvous directory '" + path +
                                "': " + std::strerror(errno) + " (set TAGMEM_PEER_DIR)");
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

}  // namespace tagmem::peers
