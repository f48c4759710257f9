/* dl_hooks.S — the shim's dlsym and dlvsym, as tail-jumping trampolines (x86-64).
 *
 * Note [dlsym tail jump]: glibc's dlsym(RTLD_NEXT, name) searches after the object that called
 * it, found from its return address. A C interposer that calls the real dlsym would make every
 * RTLD_NEXT lookup in the process search after the shim instead of after its real caller, which
 * breaks other interposers (one asking for its own "next" malloc could get itself back). So
 * these stubs ask a C router (dl_route.cpp) where to go, passing the caller's return address,
 * and then *jump* there with the original arguments and return address untouched: to the real
 * function for every symbol the shim does not care about and for every RTLD_NEXT lookup (Note
 * [RTLD_NEXT is the linker's] in dl_route.cpp), to the shim's own lookup otherwise.
 */
#if defined(__x86_64__)

    .text

    .globl dlsym
    .type dlsym, @function
dlsym:
    .cfi_startproc
    endbr64
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp                       /* 16-byte alignment for the call */
    .cfi_adjust_cfa_offset 8
    movq 24(%rsp), %rdx                 /* our caller's return address */
    call tagmem_preload_dlsym_route     /* (handle, name, caller) -> where to jump */
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    jmp *%rax
    .cfi_endproc
    .size dlsym, .-dlsym

    .globl dlvsym
    .type dlvsym, @function
dlvsym:
    .cfi_startproc
    endbr64
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    pushq %rdx
    .cfi_adjust_cfa_offset 8
    movq 24(%rsp), %rcx                 /* our caller's return address */
    call tagmem_preload_dlvsym_route    /* (handle, name, version, caller) -> where to jump */
    popq %rdx
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    jmp *%rax
    .cfi_endproc
    .size dlvsym, .-dlvsym

#endif

    .section .note.GNU-stack, "", @progbits
