// copy_gate.hpp — whether a process of the job is copying a reload on this GPU now, asked by the
// device's release thread (Note [releases wait for copies] in device/release_queue.hpp).
//
// A process whose reload copies with all the memory it needs in hand, taking no more from the job
// (Note [copying in hand] in offload/offload_engine.cpp), holds an exclusive flock on its copy mark
// (hoff-<H>-<pid>.copy in the job's private directory, handoff_point.hpp) until the copies end. Any
// process of the job and GPU, this one included, tells by trying a shared lock, without waiting, on
// each mark listed. The kernel drops the locks of a process that dies, so a killed copier holds
// nobody back; a mark whose owner is gone is removed by whoever finds it unlocked, and the owner
// removes its own when the device's service ends. Marks are files of the user's private directory;
// one that cannot be made or opened holds nothing back (logged at TAGMEM_LOG=info).
#pragma once

#include <mutex>
#include <string>

#include "device/release_queue.hpp"
#include "handoff/handoff_messages.hpp"

namespace tagmem::handoff {

class copy_gate final : public release_gate {
 public:
  copy_gate(std::string dir, std::string job, const gpu_uuid& uuid);
  ~copy_gate();  // removes this process's mark
  copy_gate(const copy_gate&) = delete;
  copy_gate& operator=(const copy_gate&) = delete;

  // A reload of this process copies with all its memory in hand / no longer (copies ended, or it
  // waits for the job's memory).
  // Reloads of several threads nest: the mark is held from the first begin to the last end.
  void begin() noexcept;
  void end() noexcept;
  // Whether a process of the job other than this one holds its mark: an offload of this one then
  // holds its copies back (Note [copies give way] in offload/give_way.hpp).
  bool others_copying() noexcept { return any_held(/*others_only=*/true); }

 private:
  bool do_copies_running() noexcept override { return any_held(/*others_only=*/false); }
  bool any_held(bool others_only) noexcept;

  const std::string dir_, job_;
  const gpu_uuid uuid_;
  std::mutex mutex_;  // a leaf; the fields below
  int copying_ = 0;
  int fd_ = -1;  // the mark, made at the first begin
};

}  // namespace tagmem::handoff
