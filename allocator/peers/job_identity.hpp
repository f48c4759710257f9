// job_identity.hpp — which job this process belongs to: processes meet (NCCL groups, handoff of
// device memory) only within one job.
//
// TAGMEM_JOB, else TAGMEM_NCCL_JOB (the older name, still read), else torchrun's run id
// (TORCHELASTIC_RUN_ID, unless "none"), else Slurm's job id with its step. A launcher's run id is
// the same in every process of one run, a restart included, and differs between runs; frameworks
// that set none of these (Ray) need TAGMEM_JOB set in each process (docs/handoff.md).
#pragma once

#include <string>

namespace tagmem::peers {

// The job's identity. Throws INVALID_ARGUMENT naming the settings when there is none, or when it
// is not 1-256 printable characters without spaces. `purpose` completes "no job identity for
// ..." in that message.
std::string job_identity(const char* purpose = "the NCCL rendezvous");

// Whether any of the settings above is set (non-empty, torchrun's not "none"): tagged-memory IPC
// works without a job, and then leaves the job out of its checks (Note [ipc without a job]).
bool has_job_identity();

// FNV-1a of `s` as 16 hex digits: picks short file names for long identities (the identities
// themselves are compared in full once the processes talk).
std::string hash_hex(const std::string& s);

}  // namespace tagmem::peers
