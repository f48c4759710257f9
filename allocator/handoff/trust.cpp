// trust.cpp — the checks on a handoff peer (see header).
#include "handoff/trust.hpp"

namespace tagmem::handoff {

std::string mismatch(const local_view& me, const peers::peer_credentials& cred,
                     const peers::process_identity& live, const claim& c) {
  const std::string them = "process " + std::to_string(cred.pid);
  if (cred.uid != me.uid) {
    return them + " runs as uid " + std::to_string(cred.uid) + ", this process as uid " +
           std::to_string(me.uid);
  }
  if (c.who.pid != cred.pid || !live.same_as(c.who)) {
    return them + " claims to be " + c.who.describe() + ", but the kernel reports " +
           live.describe();
  }
  if (c.job != me.job) {
    return them + " belongs to job '" + c.job + "', this process to job '" + me.job +
           "': memory is handed only within one job (TAGMEM_JOB)";
  }
  if (c.uuid != me.uuid) {
    return them + " uses GPU " + uuid_hex(c.uuid) + ", this process GPU " + uuid_hex(me.uuid);
  }
  if (c.granularity != me.granularity) {
    return them + " maps in units of " + std::to_string(c.granularity) +
           " bytes, this process in " + std::to_string(me.granularity);
  }
  return "";
}

}  // namespace tagmem::handoff
