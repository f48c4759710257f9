// children.hpp — a scenario runner's child processes: this program started again (fork + exec of
// /proc/self/exe: nothing of CUDA crosses the fork) with the arguments given, driven over pipes
// on its fds 3 (commands, one line each) and 4 (replies: "ok <seconds> [<a> <b>]" or
// "fail <why>"). The two-process RL switch and the replicated-tag scenario run their sides so.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tagmem::bench {

// A reply: "ok <seconds> [<a> <b>]" (a, b: the call's ends in ns, or two byte counts).
struct answer {
  double seconds = 0;
  double a = 0, b = 0;
};

struct child {
  const char* who;
  pid_t pid = -1;
  FILE* to = nullptr;
  FILE* from = nullptr;
};

// Sends one command and reads the reply line; throws std::runtime_error on "fail ..." or a
// child that died.
answer ask_full(FILE* to, FILE* from, const char* who, const char* command);
double ask(FILE* to, FILE* from, const char* who, const char* command);

// Starts the child and waits for its answer to "ready".
child spawn(const char* who, const std::vector<std::string>& args);

// Tells it to quit and waits; throws if it exited abnormally.
void finish(child& c);

// Both sides' calls at the same time: the commands go out before either reply is read.
std::pair<answer, answer> ask_both(child& out, const char* out_cmd, child& in, const char* in_cmd);

// The child's side: its command and reply pipes (fds 3 and 4); false, with a message naming
// `option` as the parent's own, when this process was not started as a child.
bool parent_pipes(FILE** in, FILE** out, const char* option);
// The child's side: writes one reply line to `out`.
void reply_line(FILE* out, const std::string& line);
// Answers "ready" and hands every other command to `handle` (an empty reply: unknown command),
// replying what it returns, or "fail <why>" for what it throws, until "quit" or the pipe's end.
void serve(FILE* in, FILE* out, const std::function<std::string(const std::string&)>& handle);

}  // namespace tagmem::bench
