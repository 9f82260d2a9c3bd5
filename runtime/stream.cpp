// yolo::Stream and yolo::Event: dispatch to a stream queue (CPU, emulated GPUs) or the CUDA
// runtime (stream.h).
#include "runtime/stream.h"

#include <mutex>
#include <utility>

#include "runtime/check.h"
#include "runtime/stream_queue.h"
#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

namespace yolo {

void set_current_device(Device device) {
#if YOLO_CUDA
  if (device.is_cuda()) CHECKED(cudaSetDevice(device.index));
  if (device.is_emu()) throw Error(device.name() + ": emulated GPUs exist only in builds whose kernels are emulated "
                                   "(build/train_yolo_emu, build/tests_emu)");
#else
  if (device.is_cuda()) throw Error("a CUDA device was requested from a CPU-only build");
  if (device.is_emu()) emu::set_current_device(device.index);
#endif
}

// ---- Event -------------------------------------------------------------------------------

Event::Event(Device device) : device_(device) {
  if (!device.is_cuda()) {
    set_current_device(device);  // an emulated GPU must exist in this build
    host_ = make_host_event();
    return;
  }
  set_current_device(device);
#if YOLO_CUDA
  CHECKED(cudaEventCreate(&cuda_));
#endif
}

Event::~Event() {
#if YOLO_CUDA
  if (cuda_) cudaEventDestroy(cuda_);  // destructors must not throw; a failure here is harmless
#endif
}

Event::Event(Event&& other) noexcept
    : device_(other.device_), host_(std::move(other.host_)) {
#if YOLO_CUDA
  cuda_ = std::exchange(other.cuda_, nullptr);
#endif
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    this->~Event();
    new (this) Event(std::move(other));
  }
  return *this;
}

namespace {
[[noreturn]] void moved_from(const char* what) {
  throw Error(std::string("use of a moved-from ") + what);
}
}  // namespace

bool Event::valid() const {
#if YOLO_CUDA
  return host_ || cuda_;
#else
  return host_ != nullptr;
#endif
}

bool Event::query() const {
  if (!valid()) moved_from("event");
  if (host_) return host_event_done(host_, host_event_issued(*host_));
#if YOLO_CUDA
  cudaError_t status = cudaEventQuery(cuda_);
  if (status == cudaErrorNotReady) return false;
  CHECKED(status);
#endif
  return true;
}

void Event::synchronize() const {
  if (!valid()) moved_from("event");
  if (host_) {
    host_event_wait(host_, host_event_issued(*host_));
    return;
  }
#if YOLO_CUDA
  CHECKED(cudaEventSynchronize(cuda_));
#endif
}

float Event::elapsed_ms_since(const Event& start) const {
  if (!valid() || !start.valid()) moved_from("event");
  if (start.device_ != device_) throw Error("elapsed_ms_since: events on different devices");
  if (host_) {
    synchronize();
    start.synchronize();
    auto latest = [](const std::shared_ptr<HostEvent>& state) {
      uint64_t generation = host_event_issued(*state);
      if (generation == 0) throw Error("elapsed_ms_since: an event was never recorded");
      return host_event_time(state, generation);
    };
    return std::chrono::duration<float, std::milli>(latest(host_) - latest(start.host_)).count();
  }
  float ms = 0;
#if YOLO_CUDA
  CHECKED(cudaEventSynchronize(start.cuda_));  // both points must be reached to be timed
  CHECKED(cudaEventSynchronize(cuda_));
  CHECKED(cudaEventElapsedTime(&ms, start.cuda_, cuda_));
#endif
  return ms;
}

#if YOLO_CUDA
cudaEvent_t Event::native() const { return cuda_; }
#endif

// ---- Stream ------------------------------------------------------------------------------

#if YOLO_CUDA
struct Stream::HostError {
  std::mutex mutex;
  std::exception_ptr first;
};
#endif

Stream::Stream(Device device, StreamPriority priority, std::string name)
    : device_(device), name_(std::move(name)) {
  if (!device.is_cuda()) {
    // Each queue has its own thread, so none waits for another; priority matters to the
    // adversarial mode of emulated GPUs (stream_queue.h).
    set_current_device(device);  // an emulated GPU must exist in this build
    queue_ = std::make_unique<StreamQueue>(name_, device.is_emu() ? device.index : -1, priority == StreamPriority::High);
    return;
  }
  set_current_device(device);
#if YOLO_CUDA
  int least = 0, greatest = 0;
  CHECKED(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CHECKED(cudaStreamCreateWithPriority(&cuda_, cudaStreamNonBlocking,
                                       priority == StreamPriority::High ? greatest : least));
  host_error_ = std::make_shared<HostError>();
#else
  (void)priority;
#endif
}

Stream::~Stream() {
  if (queue_) {
    queue_.reset();  // joins after running what was queued
    return;
  }
#if YOLO_CUDA
  if (cuda_) {
    cudaStreamSynchronize(cuda_);
    cudaStreamDestroy(cuda_);
  }
#endif
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_), name_(std::move(other.name_)), queue_(std::move(other.queue_)) {
#if YOLO_CUDA
  cuda_ = std::exchange(other.cuda_, nullptr);
  host_error_ = std::move(other.host_error_);
#endif
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    this->~Stream();
    new (this) Stream(std::move(other));
  }
  return *this;
}

bool Stream::valid() const {
#if YOLO_CUDA
  return queue_ || cuda_;
#else
  return queue_ != nullptr;
#endif
}

void Stream::record(Event& event) {
  if (!valid()) moved_from("stream");
  if (!event.valid()) moved_from("event");
  if (event.device_ != device_)
    throw Error("stream '" + name_ + "' on " + device_.name() + " cannot record an event of " +
                event.device_.name());
  if (queue_) {
    queue_->record(event.host_);
    return;
  }
#if YOLO_CUDA
  CHECKED(cudaEventRecord(event.cuda_, cuda_));
#endif
}

void Stream::wait(const Event& event) {
  if (!valid()) moved_from("stream");
  if (!event.valid()) moved_from("event");
  if (event.device_.kind != device_.kind)
    throw Error("stream '" + name_ + "' on " + device_.name() + " cannot wait on an event of " +
                event.device_.name() + " (mixing CPU, emulated and CUDA streams is not supported)");
  if (queue_) {
    queue_->wait(event.host_, host_event_issued(*event.host_));
    return;
  }
#if YOLO_CUDA
  CHECKED(cudaStreamWaitEvent(cuda_, event.cuda_, 0));
#endif
}

void Stream::enqueue(std::function<void()> work) {
  if (!valid()) moved_from("stream");
  if (queue_) {
    queue_->push(std::move(work));
    return;
  }
#if YOLO_CUDA
  struct Call {
    std::function<void()> work;
    std::shared_ptr<HostError> error;
  };
  auto* call = new Call{std::move(work), host_error_};
  auto trampoline = [](void* data) {
    std::unique_ptr<Call> owned(static_cast<Call*>(data));
    try {
      owned->work();
    } catch (...) {
      std::lock_guard lock(owned->error->mutex);
      if (!owned->error->first) owned->error->first = std::current_exception();
    }
  };
  cudaError_t status = cudaLaunchHostFunc(cuda_, trampoline, call);
  if (status != cudaSuccess) delete call;
  CHECKED(status);
#endif
}

void Stream::synchronize() {
  if (!valid()) moved_from("stream");
  if (queue_) {
    queue_->drain();
    return;
  }
#if YOLO_CUDA
  CHECKED(cudaStreamSynchronize(cuda_));
  std::exception_ptr error;
  {
    std::lock_guard lock(host_error_->mutex);
    error = std::exchange(host_error_->first, nullptr);
  }
  if (error) std::rethrow_exception(error);
#endif
}

cudaStream_t Stream::native() const {
#if YOLO_CUDA
  return cuda_;
#else
  return reinterpret_cast<cudaStream_t>(queue_.get());
#endif
}

}  // namespace yolo
