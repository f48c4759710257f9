/* fake_nccl.c — a stand-in for a dynamically linked NCCL's ncclCommRegister/ncclCommDeregister,
 * so the shim's interposers of the two can be tested on the emulated driver. A registration is a
 * token; the buffer's export to the peers, which NCCL does at the first collective, and their
 * unmapping, which it does inside ncclCommDeregister, are the test's own driver calls. */
#include <stddef.h>
#include <stdlib.h>

typedef int nccl_result; /* ncclResult_t: 0 success, 4 invalid argument, 2 system error */

__attribute__((visibility("default"))) nccl_result ncclCommRegister(void* comm, void* buff,
                                                                    size_t size, void** handle) {
  (void)comm;
  if (!buff || !size || !handle) return 4;
  *handle = malloc(1);
  return *handle ? 0 : 2;
}

__attribute__((visibility("default"))) nccl_result ncclCommDeregister(void* comm, void* handle) {
  (void)comm;
  if (!handle) return 4;
  free(handle);
  return 0;
}
