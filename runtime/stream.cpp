// yolo::Stream and yolo::Event: dispatch to the CPU queue or the CUDA runtime (stream.h).
#include "runtime/stream.h"

#include "runtime/check.h"
#include "runtime/cpu_queue.h"

#include <utility>

namespace yolo {

void set_current_device(Device device) {
#if YOLO_CUDA
  if (device.is_cuda()) CHECKED(cudaSetDevice(device.index));
#else
  if (device.is_cuda()) throw Error("a CUDA device was requested from a CPU-only build");
#endif
}

// ---- Event -------------------------------------------------------------------------------

Event::Event(Device device) : device_(device) {
  if (!device.is_cuda()) {
    cpu_ = std::make_shared<CpuState>();
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
    : device_(other.device_), cpu_(std::move(other.cpu_)) {
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
  return cpu_ || cuda_;
#else
  return cpu_ != nullptr;
#endif
}

bool Event::query() const {
  if (!valid()) moved_from("event");
  if (cpu_) {
    std::lock_guard lock(cpu_->mutex);
    return cpu_->is_complete(cpu_->recorded);
  }
#if YOLO_CUDA
  cudaError_t status = cudaEventQuery(cuda_);
  if (status == cudaErrorNotReady) return false;
  CHECKED(status);
#endif
  return true;
}

void Event::synchronize() const {
  if (!valid()) moved_from("event");
  if (cpu_) {
    uint64_t target;
    {
      std::lock_guard lock(cpu_->mutex);
      target = cpu_->recorded;
    }
    cpu_->wait_for(target);
    return;
  }
#if YOLO_CUDA
  CHECKED(cudaEventSynchronize(cuda_));
#endif
}

float Event::elapsed_ms_since(const Event& start) const {
  if (!valid() || !start.valid()) moved_from("event");
  if (start.device_ != device_) throw Error("elapsed_ms_since: events on different devices");
  if (cpu_) {
    synchronize();
    start.synchronize();
    auto latest = [](const CpuState& state) {  // one lock at a time: no lock-order deadlock
      std::lock_guard lock(const_cast<std::mutex&>(state.mutex));
      if (state.recorded == 0) throw Error("elapsed_ms_since: an event was never recorded");
      return state.latest_time();
    };
    auto end_time = latest(*cpu_);
    auto start_time = latest(*start.cpu_);
    return std::chrono::duration<float, std::milli>(end_time - start_time).count();
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
    // CPU priority is not modelled: each stream has its own thread, so none waits for another.
    cpu_ = std::make_unique<CpuQueue>(name_);
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
  if (cpu_) {
    cpu_.reset();  // joins after running what was queued
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
    : device_(other.device_), name_(std::move(other.name_)), cpu_(std::move(other.cpu_)) {
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
  return cpu_ || cuda_;
#else
  return cpu_ != nullptr;
#endif
}

void Stream::record(Event& event) {
  if (!valid()) moved_from("stream");
  if (!event.valid()) moved_from("event");
  if (event.device_ != device_)
    throw Error("stream '" + name_ + "' on " + device_.name() + " cannot record an event of " +
                event.device_.name());
  if (cpu_) {
    uint64_t generation;
    {
      std::lock_guard lock(event.cpu_->mutex);
      generation = ++event.cpu_->recorded;
    }
    cpu_->push([state = event.cpu_, generation] { state->complete(generation); });
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
                event.device_.name() + " (mixing CPU and CUDA streams is not supported)");
  if (cpu_) {
    uint64_t generation;
    {
      std::lock_guard lock(event.cpu_->mutex);
      generation = event.cpu_->recorded;
    }
    if (generation == 0) return;  // never recorded: nothing to wait for, as in CUDA
    cpu_->push([state = event.cpu_, generation] { state->wait_for(generation); });
    return;
  }
#if YOLO_CUDA
  CHECKED(cudaStreamWaitEvent(cuda_, event.cuda_, 0));
#endif
}

void Stream::enqueue(std::function<void()> work) {
  if (!valid()) moved_from("stream");
  if (cpu_) {
    cpu_->push(std::move(work));
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
  if (cpu_) {
    cpu_->drain();
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

#if YOLO_CUDA
cudaStream_t Stream::native() const { return cuda_; }
#endif

}  // namespace yolo
