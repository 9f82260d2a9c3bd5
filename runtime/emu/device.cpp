// Emulated GPUs: properties, protected device memory, pinned host memory, injected failures
// (see device.h).
#include "runtime/emu/device.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "runtime/check.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_DEVICE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_DEVICE_ASAN 1
#endif
#endif
#if EMU_DEVICE_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace yolo::emu {

namespace {

constexpr size_t kGiB = size_t(1) << 30, kMiB = size_t(1) << 20;

void check_index(int index) {
  if (index < 0 || index >= kMaxDevices)
    throw Error("emu:" + std::to_string(index) + " does not exist (emulated GPUs are emu:0.." +
                std::to_string(kMaxDevices - 1) + ")");
}

std::string gib(size_t bytes) {
  char text[32];
  if (bytes >= kGiB) std::snprintf(text, sizeof text, "%.2f GiB", double(bytes) / double(kGiB));
  else std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / double(kMiB));
  return text;
}

// Everything below is guarded by one mutex; the fault handler reads only the slot table.
std::mutex g_mutex;
DeviceProps g_props[kMaxDevices];
bool g_configured[kMaxDevices] = {};
size_t g_in_use[kMaxDevices] = {};
int64_t g_fail_countdown[kMaxDevices] = {};
std::string g_failure[kMaxDevices];  // an injected failure happened: the device's context is lost
int64_t g_launches[kMaxDevices] = {};

struct Region {
  char* begin = nullptr;
  size_t bytes = 0;   // asked for
  size_t mapped = 0;  // whole pages (device memory)
  MemoryKind kind = MemoryKind::Pageable;
  int device = -1;
};
std::vector<Region> g_regions;
int g_open = 0;  // live DeviceAccess objects

// Device regions for the SIGSEGV handler, readable without a lock.
struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<size_t> bytes{0};
  std::atomic<int> device{-1};
};
constexpr size_t kSlots = 4096;
Slot g_slots[kSlots];

thread_local int t_current_device = -1;
thread_local bool t_in_fault_handler = false;
const size_t g_page = size_t(sysconf(_SC_PAGESIZE));  // read by the fault handler: no lazy init

size_t page_size() { return g_page; }

void protect(const Region& r, int prot) {
  if (mprotect(r.begin, r.mapped, prot) != 0)
    throw Error("emulation: mprotect of emulated device memory failed: " + std::string(std::strerror(errno)));
}

void protect_all(int prot) {
  for (const Region& r : g_regions)
    if (r.kind == MemoryKind::Device) protect(r, prot);
}

// ---- the fault handler: a host access to device memory --------------------------------------

struct sigaction g_previous;
std::once_flag g_handler_installed;
std::mutex g_handler_mutex;

// Async-signal-safe text building.
struct Text {
  char buffer[512];
  size_t used = 0;
  void add(const char* s) {
    while (*s && used + 1 < sizeof buffer) buffer[used++] = *s++;
  }
  void add_number(unsigned long long v, unsigned base) {
    char digits[32];
    int n = 0;
    do {
      digits[n++] = "0123456789abcdef"[v % base];
      v /= base;
    } while (v && n < 32);
    if (base == 16) add("0x");
    while (n > 0 && used + 1 < sizeof buffer) buffer[used++] = digits[--n];
  }
};

void on_segv(int sig, siginfo_t* info, void* context) {
  // Entered again on this thread (a handler below this one re-raised the signal): end plainly.
  if (t_in_fault_handler) {
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
    return;
  }
  t_in_fault_handler = true;
  uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const Slot& slot : g_slots) {
    uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin == 0) continue;
    size_t bytes = slot.bytes.load(std::memory_order_relaxed);
    size_t mapped = (bytes + g_page - 1) / g_page * g_page;
    if (address < begin || address >= begin + (mapped ? mapped : g_page)) continue;
    Text t;
    t.add("emulation: host code touched the device memory of emu:");
    t.add_number(unsigned(slot.device.load(std::memory_order_relaxed)), 10);
    t.add(" at ");
    t.add_number(address, 16);
    t.add(" (byte ");
    t.add_number(address - begin, 10);
    t.add(" of a ");
    t.add_number(bytes, 10);
    t.add("-byte allocation) outside a kernel, copy or collective: on a GPU this is an illegal access "
          "(copy the data with copy_bytes on a stream and synchronise first)\n");
    ssize_t ignored = write(STDERR_FILENO, t.buffer, t.used);
    (void)ignored;
    break;
  }
  // The usual report (AddressSanitizer's, with the stack) or the default action.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler == SIG_DFL || g_previous.sa_handler == SIG_IGN) {
    sigaction(SIGSEGV, &g_previous, nullptr);  // the access faults again, now fatally
    return;
  }
  g_previous.sa_handler(sig);
}

void poison(void* p, size_t bytes) {
#if EMU_DEVICE_ASAN
  ASAN_POISON_MEMORY_REGION(p, bytes);
#else
  (void)p, (void)bytes;
#endif
}
void unpoison(void* p, size_t bytes) {
#if EMU_DEVICE_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, bytes);
#else
  (void)p, (void)bytes;
#endif
}

}  // namespace

void install_fault_handler() {
  std::lock_guard lock(g_handler_mutex);
  struct sigaction current;
  sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_segv) return;
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  g_previous = current;
  sigaction(SIGSEGV, &action, nullptr);
}

namespace {
DeviceProps preset(const char* name, int cc, int sms, size_t memory, size_t l2, int threads, int shared_kib) {
  DeviceProps p;
  p.name = name, p.cc_major = cc / 10, p.cc_minor = cc % 10, p.multiprocessors = sms;
  p.memory_bytes = memory, p.l2_bytes = l2, p.threads_per_sm = threads;
  p.shared_per_sm = shared_kib * 1024, p.shared_per_block = (shared_kib - 1) * 1024;
  return p;
}
}  // namespace

DeviceProps preset_for(int cc) {
  switch (cc) {
    case 75: {
      DeviceProps t4 = preset("emulated T4", 75, 40, 15 * kGiB, 4 * kMiB, 1024, 64);
      t4.shared_per_block = t4.shared_per_sm;  // Turing: 64 KB a block, the whole SM's
      return t4;
    }
    case 80: return preset("emulated A100", 80, 108, 40 * kGiB, 40 * kMiB, 2048, 164);
    case 89: return preset("emulated L4", 89, 58, 22 * kGiB, 48 * kMiB, 1536, 100);
    case 90: {
      DeviceProps h200 = preset("emulated H200", 90, 132, 140 * kGiB, 50 * kMiB, 2048, 228);
      h200.sm90a_code = true;
      return h200;
    }
    case 100: return preset("emulated B200", 100, 148, 180 * kGiB, 126 * kMiB, 2048, 228);
    case 120: return preset("emulated RTX 5090", 120, 170, 31 * kGiB, 96 * kMiB, 1536, 100);
    default:
      throw Error("no emulated GPU preset for sm_" + std::to_string(cc) +
                  " (sm75 T4, sm80 A100, sm89 L4, sm90 H200, sm100 B200, sm120 RTX 5090)");
  }
}

DeviceProps device_props(int index) {
  check_index(index);
  std::lock_guard lock(g_mutex);
  return g_configured[index] ? g_props[index] : preset_for(90);
}

void configure_device(int index, const DeviceProps& props) {
  check_index(index);
  if (props.multiprocessors < 1 || props.memory_bytes == 0)
    throw Error("emu:" + std::to_string(index) + ": an emulated GPU needs at least 1 SM and some memory");
  std::lock_guard lock(g_mutex);
  g_props[index] = props;
  g_configured[index] = true;
}

void set_current_device(int index) {
  if (index >= 0) check_index(index);
  t_current_device = index;
}


int current_device_index() { return t_current_device; }
int current_compute_capability() {
  if (t_current_device < 0) return 90;
  const DeviceProps props = device_props(t_current_device);
  return props.cc_major * 10 + props.cc_minor;
}
bool current_device_runs_sm90a_code() { return t_current_device < 0 || device_props(t_current_device).sm90a_code; }
int current_multiprocessors() { return t_current_device < 0 ? 4 : device_props(t_current_device).multiprocessors; }

void* allocate_device(int device, size_t bytes) {
  check_index(device);
  std::call_once(g_handler_installed, install_fault_handler);
  const size_t page = page_size();
  const size_t mapped = (bytes + page - 1) / page * page + (bytes == 0 ? page : 0);
  {
    std::lock_guard lock(g_mutex);
    size_t total = g_configured[device] ? g_props[device].memory_bytes : preset_for(90).memory_bytes;
    if (g_in_use[device] > total || bytes > total - g_in_use[device])
      throw Error("out of memory on emu:" + std::to_string(device) + ": asked for " + gib(bytes) + ", " +
                  gib(total > g_in_use[device] ? total - g_in_use[device] : 0) + " free of " + gib(total));
    g_in_use[device] += bytes;
  }
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::lock_guard lock(g_mutex);
    g_in_use[device] -= bytes;
    throw Error("out of host memory emulating " + gib(bytes) + " of device memory on emu:" + std::to_string(device));
  }
  std::memset(p, 0xFF, bytes);
  poison(static_cast<char*>(p) + bytes, mapped - bytes);
  std::lock_guard lock(g_mutex);
  Region r{static_cast<char*>(p), bytes, mapped, MemoryKind::Device, device};
  Slot* slot = nullptr;
  for (Slot& s : g_slots)
    if (s.begin.load(std::memory_order_relaxed) == 0) {
      slot = &s;
      break;
    }
  if (!slot) {
    munmap(p, mapped);
    g_in_use[device] -= bytes;
    throw Error("emulation: more than " + std::to_string(kSlots) + " emulated device allocations are live");
  }
  slot->bytes.store(bytes, std::memory_order_relaxed);
  slot->device.store(device, std::memory_order_relaxed);
  if (g_open == 0 && mprotect(r.begin, r.mapped, PROT_NONE) != 0) {
    munmap(p, mapped);
    g_in_use[device] -= bytes;
    throw Error("emulation: mprotect of emulated device memory failed: " + std::string(std::strerror(errno)));
  }
  slot->begin.store(reinterpret_cast<uintptr_t>(p), std::memory_order_release);
  g_regions.push_back(r);
  return p;
}

void free_device(void* p) {
  if (!p) return;
  Region r;
  {
    std::lock_guard lock(g_mutex);
    auto it = g_regions.begin();
    while (it != g_regions.end() && !(it->begin == p && it->kind == MemoryKind::Device)) ++it;
    if (it == g_regions.end()) return;  // not ours; never throws (called from destructors)
    r = *it;
    g_regions.erase(it);
    g_in_use[r.device] -= r.bytes;
    for (Slot& s : g_slots)
      if (s.begin.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(p))
        s.begin.store(0, std::memory_order_release);
  }
  unpoison(r.begin, r.mapped);
  munmap(r.begin, r.mapped);
}

size_t device_bytes_in_use(int device) {
  check_index(device);
  std::lock_guard lock(g_mutex);
  return g_in_use[device];
}

void* allocate_pinned(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes == 0 ? 1 : bytes) != 0)
    throw Error("out of host memory allocating " + std::to_string(bytes) + " pinned bytes");
  std::lock_guard lock(g_mutex);
  g_regions.push_back(Region{static_cast<char*>(p), bytes, 0, MemoryKind::Pinned, -1});
  return p;
}

void free_pinned(void* p) {
  if (!p) return;
  {
    std::lock_guard lock(g_mutex);
    for (auto it = g_regions.begin(); it != g_regions.end(); ++it)
      if (it->begin == p && it->kind == MemoryKind::Pinned) {
        g_regions.erase(it);
        break;
      }
  }
  std::free(p);
}

MemoryKind memory_kind(const void* p, int* device) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard lock(g_mutex);
  for (const Region& r : g_regions)
    if (c >= r.begin && c < r.begin + (r.bytes ? r.bytes : 1)) {
      if (device) *device = r.device;
      return r.kind;
    }
  return MemoryKind::Pageable;
}

DeviceAccess::DeviceAccess() {
  std::lock_guard lock(g_mutex);
  if (g_open++ > 0) return;
  try {
    protect_all(PROT_READ | PROT_WRITE);
  } catch (...) {
    --g_open;  // closed again, as far as it can be
    try {
      protect_all(PROT_NONE);
    } catch (...) {
    }
    throw;
  }
}

DeviceAccess::~DeviceAccess() {
  std::lock_guard lock(g_mutex);
  if (--g_open == 0) {
    try {
      protect_all(PROT_NONE);
    } catch (const std::exception&) {
      // Destructors never throw; the memory simply stays accessible.
    }
  }
}

void fail_kernel_launch(int device, int64_t nth) {
  check_index(device);
  if (nth < 0) throw Error("fail_kernel_launch: negative launch number");
  std::lock_guard lock(g_mutex);
  g_fail_countdown[device] = nth;
  g_failure[device].clear();  // a test arming or disarming starts from a working device
}

std::string device_failure(int device) {
  if (device < 0 || device >= kMaxDevices) return "";
  std::lock_guard lock(g_mutex);
  return g_failure[device];
}

void count_kernel_launch(int device, const char* kernel) {
  if (device < 0 || device >= kMaxDevices) return;
  std::lock_guard lock(g_mutex);
  ++g_launches[device];
  // As on a GPU, whose context an illegal access loses: every later kernel fails too.
  if (!g_failure[device].empty()) throw Error(g_failure[device] + "; " + kernel + " did not run");
  if (g_fail_countdown[device] == 0 || --g_fail_countdown[device] > 0) return;
  g_failure[device] = std::string("an illegal memory access in ") + kernel + " on emu:" + std::to_string(device) +
                      " (a failure injected by a test)";
  throw Error(g_failure[device]);
}

int64_t kernel_launches(int device) {
  check_index(device);
  std::lock_guard lock(g_mutex);
  return g_launches[device];
}

}  // namespace yolo::emu
