// The emulation's fiber switch on x86-64 (fake/emulation.h, FiberLanes): saves the callee-saved
// registers on the current stack, stores the stack pointer in *save_sp, and resumes the fiber
// whose stack pointer is load_sp. ucontext's swapcontext also restores the signal mask (a system
// call per switch, which took half the emulated backend's time). MXCSR and the x87 control word
// are left alone: every lane runs on the launching thread, whose floating-point environment no
// kernel changes, and restoring them (ldmxcsr, fldcw) took 55% of the emulated offload grids.
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
asm(R"(
.text
.globl strata_emu_switch
.type strata_emu_switch,@function
strata_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size strata_emu_switch,.-strata_emu_switch
.section .note.GNU-stack,"",@progbits
)");
#endif
