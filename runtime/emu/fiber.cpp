// Fiber implementation: a hand-written context switch on x86-64 (context_switch_x86_64.S),
// ucontext elsewhere; stacks from mmap with a guard page, so a runaway kernel stack faults.
#include "runtime/emu/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#if EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

extern "C" void yolo_emu_switch(void** save_sp, void* load_sp);

namespace yolo::emu {

struct Fiber::Impl {
  void* mapping = nullptr;
  size_t mapping_bytes = 0;
  char* stack_bottom = nullptr;  // lowest usable address
  size_t stack_bytes = 0;
  void* fake_stack = nullptr;    // AddressSanitizer's bookkeeping while suspended
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t context{};
#endif
};

namespace {

// The scheduler's side of the switch, per host thread.
thread_local Fiber* t_current = nullptr;
thread_local const void* t_sched_bottom = nullptr;
thread_local size_t t_sched_size = 0;
thread_local void* t_sched_fake = nullptr;
#if defined(__x86_64__)
thread_local void* t_sched_sp = nullptr;
#else
thread_local ucontext_t t_sched_context;
#endif

inline void asan_start(void** fake_save, const void* bottom, size_t size) {
#if EMU_ASAN
  __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
  (void)fake_save, (void)bottom, (void)size;
#endif
}

inline void asan_finish(void* fake, const void** bottom_old, size_t* size_old) {
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, bottom_old, size_old);
#else
  (void)fake, (void)bottom_old, (void)size_old;
#endif
}

}  // namespace

Fiber::Fiber(size_t stack_bytes) : impl_(std::make_unique<Impl>()) {
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  stack_bytes = (stack_bytes + page - 1) / page * page;
  impl_->mapping_bytes = stack_bytes + page;
  impl_->mapping = mmap(nullptr, impl_->mapping_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (impl_->mapping == MAP_FAILED) throw std::runtime_error("emu: cannot map a fiber stack");
  mprotect(impl_->mapping, page, PROT_NONE);  // guard page below the stack
  impl_->stack_bottom = static_cast<char*>(impl_->mapping) + page;
  impl_->stack_bytes = stack_bytes;
#if defined(__x86_64__)
  // Initial frame, as yolo_emu_switch expects to find it: control words, six callee-saved
  // registers, then the address it "returns" to (entry), then entry's own fake return address.
  auto top = reinterpret_cast<uintptr_t>(impl_->stack_bottom + stack_bytes) & ~uintptr_t(15);
  auto* frame = reinterpret_cast<uint64_t*>(top - 80);
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  frame[0] = fpucw;
  frame[1] = mxcsr;
  for (int i = 2; i < 8; ++i) frame[i] = 0;
  frame[8] = reinterpret_cast<uint64_t>(&Fiber::entry);
  frame[9] = 0;
  impl_->sp = frame;
#else
  getcontext(&impl_->context);
  impl_->context.uc_stack.ss_sp = impl_->stack_bottom;
  impl_->context.uc_stack.ss_size = stack_bytes;
  impl_->context.uc_link = nullptr;
  makecontext(&impl_->context, &Fiber::entry, 0);
#endif
}

Fiber::~Fiber() {
#if EMU_ASAN
  // Pooled fibers live until their host thread exits, suspended between bodies.
  ASAN_UNPOISON_MEMORY_REGION(impl_->stack_bottom, impl_->stack_bytes);
#endif
  munmap(impl_->mapping, impl_->mapping_bytes);
}

void Fiber::resume() {
  t_current = this;
  asan_start(&t_sched_fake, impl_->stack_bottom, impl_->stack_bytes);
#if defined(__x86_64__)
  yolo_emu_switch(&t_sched_sp, impl_->sp);
#else
  swapcontext(&t_sched_context, &impl_->context);
#endif
  asan_finish(t_sched_fake, nullptr, nullptr);
  t_current = nullptr;
}

void Fiber::suspend() {
  Fiber* self = t_current;
  asan_start(&self->impl_->fake_stack, t_sched_bottom, t_sched_size);
#if defined(__x86_64__)
  yolo_emu_switch(&self->impl_->sp, t_sched_sp);
#else
  swapcontext(&self->impl_->context, &t_sched_context);
#endif
  asan_finish(self->impl_->fake_stack, &t_sched_bottom, &t_sched_size);
}

void Fiber::entry() {
  asan_finish(nullptr, &t_sched_bottom, &t_sched_size);
  for (;;) {
    Fiber* self = t_current;
    (*self->body_)();  // the scheduler's body catches everything: nothing unwinds past here
    self->finished_ = true;
    suspend();
  }
}

Fiber* FiberPool::acquire() {
  if (idle_.empty()) {
    // Sanitizer instrumentation makes frames several times larger; 256 KiB is virtual memory
    // (MAP_NORESERVE), touched only as deep as a kernel's stack really goes.
    all_.push_back(std::make_unique<Fiber>(256 * 1024));
    idle_.push_back(all_.back().get());
  }
  Fiber* f = idle_.back();
  idle_.pop_back();
  return f;
}

FiberPool& fiber_pool() {
  thread_local FiberPool pool;
  return pool;
}

}  // namespace yolo::emu
