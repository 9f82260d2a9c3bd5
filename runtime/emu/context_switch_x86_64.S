// yolo_emu_switch(void** save_sp, void* load_sp): saves the callee-saved registers and the
// SSE/x87 control words on the current stack, stores the stack pointer in *save_sp, switches
// to load_sp and restores what was saved there. The layout must match make_context() in
// fiber.cpp. System V x86-64 only; other targets use ucontext (fiber.cpp).
#if defined(__x86_64__)
    .text
    .globl yolo_emu_switch
    .type yolo_emu_switch, @function
yolo_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr 8(%rsp)
    fldcw (%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size yolo_emu_switch, .-yolo_emu_switch
#endif
    .section .note.GNU-stack,"",@progbits
