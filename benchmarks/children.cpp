// children.cpp — see children.hpp.
#include "children.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

namespace tagmem::bench {

// Sends one command and reads the reply line ("ok ..." or "fail <why>").
answer ask_full(FILE* to, FILE* from, const char* who, const char* command) {
  std::fprintf(to, "%s\n", command);
  std::fflush(to);
  char line[1024];
  if (!std::fgets(line, sizeof line, from)) {
    throw std::runtime_error(std::string(who) + " died during '" + command + "'");
  }
  answer r;
  if (std::sscanf(line, "ok %lf %lf %lf", &r.seconds, &r.a, &r.b) < 1) {
    throw std::runtime_error(std::string(who) + " '" + command + "': " + line);
  }
  return r;
}

double ask(FILE* to, FILE* from, const char* who, const char* command) {
  return ask_full(to, from, who, command).seconds;
}

child spawn(const char* who, const std::vector<std::string>& args) {
  int cmd[2], rep[2];
  if (pipe2(cmd, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe2 failed");
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  child c{who};
  c.pid = fork();
  if (c.pid < 0) throw std::runtime_error("fork failed");
  if (c.pid == 0) {  // only async-signal-safe calls until exec
    // Through fds above 4 first: dup2 onto an fd that is already the source keeps its
    // close-on-exec flag, and the two targets must not clobber each other's source.
    const int c_fd = fcntl(cmd[0], F_DUPFD, 10), r_fd = fcntl(rep[1], F_DUPFD, 10);
    if (c_fd < 0 || r_fd < 0 || dup2(c_fd, 3) < 0 || dup2(r_fd, 4) < 0) _exit(127);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(cmd[0]);
  close(rep[1]);
  c.to = fdopen(cmd[1], "w");
  c.from = fdopen(rep[0], "r");
  ask(c.to, c.from, who, "ready");
  return c;
}

void finish(child& c) {
  if (c.to) {
    std::fprintf(c.to, "quit\n");
    std::fclose(c.to);
  }
  if (c.from) std::fclose(c.from);
  int status = 0;
  if (c.pid > 0) waitpid(c.pid, &status, 0);
  if (c.pid > 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    throw std::runtime_error(std::string(c.who) + " exited abnormally");
  }
}

// Both sides' calls at the same time: the commands go out before either reply is read.
std::pair<answer, answer> ask_both(child& out, const char* out_cmd, child& in, const char* in_cmd) {
  std::fprintf(out.to, "%s\n", out_cmd);
  std::fflush(out.to);
  const answer b = ask_full(in.to, in.from, in.who, in_cmd);
  char line[1024];
  if (!std::fgets(line, sizeof line, out.from)) {
    throw std::runtime_error(std::string(out.who) + " died during '" + out_cmd + "'");
  }
  answer a;
  if (std::sscanf(line, "ok %lf %lf %lf", &a.seconds, &a.a, &a.b) < 1) {
    throw std::runtime_error(std::string(out.who) + " '" + out_cmd + "': " + line);
  }
  return {a, b};
}

void reply_line(FILE* out, const std::string& line) {
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
}

bool parent_pipes(FILE** in, FILE** out, const char* option) {
  *in = fdopen(3, "r");
  *out = fdopen(4, "w");
  if (*in && *out) return true;
  std::fprintf(stderr, "%s is for the benchmark's own child processes\n", option);
  return false;
}

void serve(FILE* in, FILE* out, const std::function<std::string(const std::string&)>& handle) {
  char line[256];
  while (std::fgets(line, sizeof line, in)) {
    const std::string cmd(line, std::strcspn(line, "\n"));
    if (cmd == "quit") break;
    try {
      std::string r = cmd == "ready" ? "ok 0" : handle(cmd);
      reply_line(out, r.empty() ? "fail unknown command " + cmd : r);
    } catch (const std::exception& ex) {
      reply_line(out, std::string("fail ") + ex.what());
    }
  }
}

}  // namespace tagmem::bench
