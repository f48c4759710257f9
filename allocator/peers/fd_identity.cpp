// fd_identity.cpp — comparing open file descriptions (see header).
#include "peers/fd_identity.hpp"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

namespace tagmem::peers {
namespace {

std::atomic<bool> g_kcmp_usable{true};
std::mutex g_flip_mutex;  // one flip at a time, so no flip is mistaken for another

// 1: same, 0: different, -1: kcmp unavailable (ENOSYS, or EPERM under a seccomp filter).
int kcmp_files(int a, int b) {
  if (!g_kcmp_usable.load(std::memory_order_relaxed)) return -1;
  pid_t self = ::getpid();
  long r = ::syscall(SYS_kcmp, self, self, KCMP_FILE, a, b);
  if (r >= 0) return r == 0 ? 1 : 0;
  if (errno == ENOSYS || errno == EPERM || errno == EACCES) g_kcmp_usable = false;
  return -1;
}

bool flip_test(int a, int b) {
  std::lock_guard lock(g_flip_mutex);
  int fa = ::fcntl(a, F_GETFL);
  int fb = ::fcntl(b, F_GETFL);
  if (fa < 0 || fb < 0 || fa != fb) return false;  // one description has one set of flags
  if (::fcntl(a, F_SETFL, fa ^ O_APPEND) != 0) return false;
  int after = ::fcntl(b, F_GETFL);
  ::fcntl(a, F_SETFL, fa);
  return after >= 0 && ((after ^ fb) & O_APPEND) != 0;
}

}  // namespace

bool same_open_file(int a, int b) {
  if (a < 0 || b < 0) return false;
  if (a == b) return true;
  struct stat sa {
  }, sb{};
  if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) return false;
  if (sa.st_dev != sb.st_dev || sa.st_ino != sb.st_ino) return false;
  int k = kcmp_files(a, b);
  if (k >= 0) return k == 1;
  return flip_test(a, b);
}

}  // namespace tagmem::peers
