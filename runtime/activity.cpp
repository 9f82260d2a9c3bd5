// Device activity recording (see activity.h).
#include "runtime/activity.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <string>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>

#include "runtime/dynamic_library.h"

#if YOLO_CUDA && __has_include(<cupti.h>)
#define YOLO_HAVE_CUPTI 1
#include <cupti.h>
#include <cxxabi.h>
#else
#define YOLO_HAVE_CUPTI 0
#endif

namespace yolo {

namespace {

// Spans per device, keyed by (kind, index): filled by the emulated queues' threads and CUPTI's
// buffer callbacks, emptied by take().
struct SpanBook {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::vector<ActivitySpan>> spans;
  std::map<std::pair<int, int>, int> recorders;  // recorders alive per device
  int64_t lost = 0;  // CUPTI records dropped or without valid times, since the process started
  // The spans' names: a deque, so that a name's reference stays valid as names are added; keyed
  // by what they were made from (a kernel's mangled name, a copy kind, a queue's name).
  std::deque<std::string> names{""};
  std::map<std::string, uint32_t> ids;
};

SpanBook& book() {
  static SpanBook* b = new SpanBook;  // never destroyed: CUPTI may hand back buffers at exit
  return *b;
}

std::pair<int, int> key_of(Device d) { return {static_cast<int>(d.kind), d.index}; }

// The id of the name made from `key` (the book's lock held): made once per key.
template <typename MakeName>
uint32_t intern(SpanBook& b, const std::string& key, MakeName make_name) {
  auto [it, inserted] = b.ids.try_emplace(key, static_cast<uint32_t>(b.names.size()));
  if (inserted) b.names.push_back(make_name());
  return it->second;
}

// Emulated devices being recorded (bit i: emu:i; devices past 63 are not recorded), read by every
// emulated queue item: one relaxed load when nobody records.
std::atomic<uint64_t> g_emulated_on{0};

#if YOLO_HAVE_CUPTI
struct CuptiApi {
  CUptiResult (*ActivityEnable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*ActivityDisable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*ActivityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc,
                                           CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*ActivityFlushAll)(uint32_t) = nullptr;
  CUptiResult (*ActivityGetNextRecord)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*GetTimestamp)(uint64_t*) = nullptr;
  CUptiResult (*GetResultString)(CUptiResult, const char**) = nullptr;
  CUptiResult (*ActivityGetNumDroppedRecords)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*Subscribe)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*) = nullptr;
};

CuptiApi g_cupti;
// MEMCPY2: copies between devices (a cudaMemcpyDefault copy may be one).
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_MEMSET};
constexpr size_t kBufferBytes = size_t{4} << 20;
std::mutex g_cupti_mutex;  // not the book's: enabling and disabling may hand back buffers
int g_cupti_users = 0;     // recorders of GPUs alive

std::string cupti_error(CUptiResult r) {
  const char* text = nullptr;
  if (g_cupti.GetResultString && g_cupti.GetResultString(r, &text) == CUPTI_SUCCESS && text) return text;
  return "CUPTI error " + std::to_string(static_cast<int>(r));
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI asks for 8-byte alignment.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

// The record's span for a device with a live recorder (the book's lock held). CUPTI records every
// device of the process; a record without valid times (CUPTI short of device memory) is lost.
// A kernel's function name from its mangled symbol: demangled, without the parameter list.
std::string kernel_name(const char* mangled) {
  if (!mangled) return "kernel";
  int status = 0;
  char* plain = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && plain ? plain : mangled;
  std::free(plain);
  if (size_t paren = name.find('('); paren != std::string::npos && paren > 0) name.resize(paren);
  return name;
}

const char* memcpy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
  }
}

template <typename Record>
void add_span(SpanBook& b, const Record* r, uint32_t name) {
  static_assert(offsetof(Record, start) == 16 && offsetof(Record, end) == 24, "CUPTI record layout");
  if (r->start == 0 || r->end < r->start) {
    ++b.lost;
    return;
  }
  const std::pair<int, int> key{static_cast<int>(DeviceKind::Cuda), static_cast<int>(r->deviceId)};
  if (auto it = b.recorders.find(key); it == b.recorders.end() || it->second == 0) return;
  b.spans[key].push_back(ActivitySpan{static_cast<int64_t>(r->start), static_cast<int64_t>(r->end), name});
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard lock(book().mutex);
    CUpti_Activity* record = nullptr;
    while (g_cupti.ActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          const char* mangled = kernel->name ? kernel->name : "";
          add_span(book(), kernel, intern(book(), std::string("k ") + mangled, [&] { return kernel_name(mangled); }));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          const char* name = memcpy_name(copy->copyKind);
          add_span(book(), copy, intern(book(), name, [&] { return std::string(name); }));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY2:
          add_span(book(), reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(record),
                   intern(book(), "memcpy PtoP", [] { return std::string("memcpy PtoP"); }));
          break;
        case CUPTI_ACTIVITY_KIND_MEMSET:
          add_span(book(), reinterpret_cast<const CUpti_ActivityMemset4*>(record),
                   intern(book(), "memset", [] { return std::string("memset"); }));
          break;
        default:
          break;
      }
    }
    size_t dropped = 0;
    if (g_cupti.ActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS)
      book().lost += static_cast<int64_t>(dropped);
  }
  std::free(buffer);
}

// cuptiSubscribe's callback: this client subscribes only to learn whether another CUPTI client
// (a profiler, a debugger) is attached; it enables no callbacks.
void CUPTIAPI no_callback(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

// Loads libcupti once: "" or why it cannot be used.
const std::string& cupti_load_error() {
  static const std::string error = [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("YOLO_CUPTI_LIB"); env && *env) {
      std::filesystem::path p(env);
      candidates.push_back(std::filesystem::is_directory(p) ? (p / "libcupti.so.13").string() : p.string());
    }
    candidates.push_back("libcupti.so.13");
    candidates.push_back("libcupti.so");
    for (const char* dir : {"/usr/local/cuda/extras/CUPTI/lib64", "/usr/local/cuda/lib64", "/usr/local/cuda/lib"})
      candidates.push_back(std::string(dir) + "/libcupti.so.13");
    std::string path, why;
    void* handle = nullptr;
    for (const std::string& name : candidates)
      if ((handle = try_dlopen(name, &path, &why))) break;
    if (!handle) return "libcupti not found (" + why + "; set YOLO_CUPTI_LIB to the library or its folder)";
    why.clear();
    bool ok =
        bind_symbol(handle, "cuptiActivityEnable", &g_cupti.ActivityEnable, "CUPTI", &why) &&
        bind_symbol(handle, "cuptiActivityDisable", &g_cupti.ActivityDisable, "CUPTI", &why) &&
        bind_symbol(handle, "cuptiActivityRegisterCallbacks", &g_cupti.ActivityRegisterCallbacks, "CUPTI", &why) &&
        bind_symbol(handle, "cuptiActivityFlushAll", &g_cupti.ActivityFlushAll, "CUPTI", &why) &&
        bind_symbol(handle, "cuptiActivityGetNextRecord", &g_cupti.ActivityGetNextRecord, "CUPTI", &why) &&
        bind_symbol(handle, "cuptiGetTimestamp", &g_cupti.GetTimestamp, "CUPTI", &why) &&
        bind_symbol(handle, "cuptiGetResultString", &g_cupti.GetResultString, "CUPTI", &why) &&
        bind_symbol(handle, "cuptiActivityGetNumDroppedRecords", &g_cupti.ActivityGetNumDroppedRecords, "CUPTI",
                    &why) &&
        bind_symbol(handle, "cuptiSubscribe", &g_cupti.Subscribe, "CUPTI", &why);
    if (!ok) return path + ": " + why;
    // Every CUPTI client subscribes first: that fails while another one (Nsight, a debugger) is
    // attached, whose buffers and callbacks must not be touched.
    CUpti_SubscriberHandle subscriber = nullptr;
    if (CUptiResult r = g_cupti.Subscribe(&subscriber, no_callback, nullptr); r != CUPTI_SUCCESS)
      return path + ": cuptiSubscribe: " + cupti_error(r) +
             (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? " (another profiler or debugger is attached)" : "");
    if (CUptiResult r = g_cupti.ActivityRegisterCallbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS)
      return path + ": cuptiActivityRegisterCallbacks: " + cupti_error(r);
    return std::string();
  }();
  return error;
}

// The first GPU recorder enables the record kinds; "" or why not.
std::string cupti_start() {
  if (const std::string& e = cupti_load_error(); !e.empty()) return e;
  std::lock_guard lock(g_cupti_mutex);
  if (g_cupti_users++ > 0) return "";
  for (size_t k = 0; k < std::size(kKinds); ++k)
    if (CUptiResult r = g_cupti.ActivityEnable(kKinds[k]); r != CUPTI_SUCCESS) {
      for (size_t j = 0; j < k; ++j) g_cupti.ActivityDisable(kKinds[j]);
      --g_cupti_users;
      return "cuptiActivityEnable: " + cupti_error(r) +
             (r == CUPTI_ERROR_NOT_INITIALIZED ? " (a driver older than this CUPTI?)" : "");
    }
  return "";
}

void cupti_stop() {
  std::lock_guard lock(g_cupti_mutex);
  if (--g_cupti_users > 0) return;
  for (CUpti_ActivityKind kind : kKinds) g_cupti.ActivityDisable(kind);
}
#endif

}  // namespace

int64_t emulated_activity_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool emulated_activity_on(int emulated_device) {
  return emulated_device >= 0 && emulated_device < 64 &&
         (g_emulated_on.load(std::memory_order_relaxed) >> emulated_device & 1) != 0;
}

void record_emulated_activity(int emulated_device, int64_t start_ns, int64_t end_ns, const std::string& queue) {
  std::lock_guard lock(book().mutex);
  const uint32_t name = intern(book(), "q " + queue, [&] { return "emu " + queue; });
  book().spans[key_of(Device::emu(emulated_device))].push_back(ActivitySpan{start_ns, end_ns, name});
}

const std::string& activity_name(uint32_t name) {
  std::lock_guard lock(book().mutex);
  return name < book().names.size() ? book().names[name] : book().names[0];
}

ActivityRecorder::ActivityRecorder(Device device) : device_(device) {
  if (device.is_emu() && device.index >= 64) {
    why_not_ = "emulated devices past emu:63 are not recorded";
  } else if (device.is_cuda()) {
#if YOLO_HAVE_CUPTI
    why_not_ = cupti_start();
#else
    why_not_ = "this binary was built without CUPTI's headers";
#endif
  } else if (!device.is_emu()) {
    why_not_ = "the CPU backend runs its ops on the host";
  }
  if (!available()) return;
  std::lock_guard lock(book().mutex);
  if (book().recorders[key_of(device)]++ == 0) book().spans[key_of(device)].clear();
  if (device.is_emu()) g_emulated_on.fetch_or(uint64_t{1} << device.index);
}

ActivityRecorder::~ActivityRecorder() {
  if (!available()) return;
  {
    std::lock_guard lock(book().mutex);
    if (--book().recorders[key_of(device_)] == 0) {
      book().spans.erase(key_of(device_));
      if (device_.is_emu()) g_emulated_on.fetch_and(~(uint64_t{1} << device_.index));
    }
  }
#if YOLO_HAVE_CUPTI
  if (device_.is_cuda()) cupti_stop();
#endif
}

int64_t ActivityRecorder::now_ns() const {
#if YOLO_HAVE_CUPTI
  if (device_.is_cuda()) {
    uint64_t t = 0;  // CUPTI's clock, not the host's steady clock: 0 when it cannot be read
    return available() && g_cupti.GetTimestamp(&t) == CUPTI_SUCCESS ? static_cast<int64_t>(t) : 0;
  }
#endif
  return emulated_activity_now_ns();
}

int64_t ActivityRecorder::lost() const {
  std::lock_guard lock(book().mutex);
  return book().lost;
}

std::vector<ActivitySpan> ActivityRecorder::take() {
  if (!available()) return {};
#if YOLO_HAVE_CUPTI
  // Hands back every buffer whose records are complete (the callback files them).
  if (device_.is_cuda()) g_cupti.ActivityFlushAll(0);
#endif
  std::lock_guard lock(book().mutex);
  return std::exchange(book().spans[key_of(device_)], {});
}

IdleTime idle_time(std::vector<ActivitySpan> spans, int64_t begin, int64_t end) {
  for (ActivitySpan& s : spans) {
    s.start_ns = std::max(s.start_ns, begin);
    s.end_ns = std::min(s.end_ns, end);
  }
  std::erase_if(spans, [](const ActivitySpan& s) { return s.end_ns <= s.start_ns; });
  if (spans.empty()) return {};
  std::sort(spans.begin(), spans.end(),
            [](const ActivitySpan& a, const ActivitySpan& b) { return a.start_ns < b.start_ns; });
  int64_t busy = 0, idle = 0;
  int64_t run_start = spans[0].start_ns, run_end = spans[0].end_ns;  // the covered run being merged
  for (size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].start_ns > run_end) {
      busy += run_end - run_start;
      idle += spans[k].start_ns - run_end;
      run_start = spans[k].start_ns;
    }
    run_end = std::max(run_end, spans[k].end_ns);
  }
  busy += run_end - run_start;
  return IdleTime{busy * 1e-6, idle * 1e-6};
}

}  // namespace yolo
