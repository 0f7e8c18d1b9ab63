// The emulation's fiber switch on x86-64 (fake/emulation.h, FiberLanes): saves the callee-saved
// registers, MXCSR and the x87 control word on the current stack, stores the stack pointer in
// *save_sp, and resumes the fiber whose stack pointer is load_sp. ucontext's swapcontext does the
// same plus a signal-mask system call per switch, which took half the emulated backend's time.
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
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
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
