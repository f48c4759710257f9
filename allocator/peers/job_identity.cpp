// job_identity.cpp — the job this process belongs to (see header).
#include "peers/job_identity.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/error.hpp"
#include "options/options.hpp"

namespace tagmem::peers {
namespace {

bool valid_job(const std::string& s) {
  if (s.empty() || s.size() > 256) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// The job identity the environment names and the variable it came from, in order of precedence;
// false when none does.
bool find_job(std::string& job, std::string& from) {
  if (const char* j = option_env(option::JOB)) {
    job = j;
    from = "TAGMEM_JOB";
  } else if (const char* n = option_env(option::NCCL_JOB)) {
    job = n;
    from = "TAGMEM_NCCL_JOB";
  } else if (const char* id = env("TORCHELASTIC_RUN_ID"); id && std::strcmp(id, "none") != 0) {
    job = std::string("torchrun:") + id;
    from = "TORCHELASTIC_RUN_ID";
  } else if (const char* slurm = env("SLURM_JOB_ID")) {
    job = std::string("slurm:") + slurm;
    if (const char* step = env("SLURM_STEP_ID")) job += std::string(".") + step;
    from = "SLURM_JOB_ID";
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool has_job_identity() {
  std::string job, from;
  return find_job(job, from);
}

std::string job_identity(const char* purpose) {
  std::string job, from;
  if (!find_job(job, from)) {
    fail(TAGMEM_ERROR_INVALID_ARGUMENT,
         std::string("no job identity for ") + purpose +
             ": set TAGMEM_JOB to a value unique to this job and the same in all of its "
             "processes (torchrun sets TORCHELASTIC_RUN_ID, Slurm SLURM_JOB_ID; neither is set, "
             "or torchrun's is 'none')");
  }
  TAGMEM_EXPECTS(
      valid_job(job), TAGMEM_ERROR_INVALID_ARGUMENT,
      "the job identity from " + from + " must be 1-256 printable characters without spaces");
  return job;
}

std::string hash_hex(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace tagmem::peers
