// Streams and events with one interface for every device kind.
//   CUDA: a cudaStream_t / cudaEvent_t on the stream's device.
//   CPU and emulated GPUs: an in-order work queue run by its own thread (runtime/stream_queue.h);
//         an event marks a point in a queue and another stream can wait on it, so overlap logic
//         (compute vs communication) is real and testable without a GPU. Emulated GPUs' queues
//         also run their kernels (launched on native()) and take part in the adversarial mode.
// Semantics follow CUDA: wait() waits for the most recent record() made before the call; waiting
// on an event never recorded does nothing; work on one stream runs in enqueue order.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device.h"

#if YOLO_CUDA
#include <cuda_runtime_api.h>
#else
struct CUstream_st;
using cudaStream_t = CUstream_st*;  // in builds with emulated kernels: a StreamQueue (stream_queue.h)
#endif

namespace yolo {

enum class StreamPriority { Normal, High };  // High: communication, so all-reduces start first

struct HostEvent;
class StreamQueue;
struct CapturedGraph;
class Stream;

// A captured sequence of stream work (Stream::begin_capture .. end_capture), replayed as one
// launch. CUDA streams: a CUDA Graph (cudaStreamBeginCapture in thread-local mode, instantiated
// once, cudaGraphLaunch). CPU and emulated streams: the captured items pushed again, the capture's
// events replaced by fresh ones each launch (the dependencies inside hold; the Event objects
// recorded during capture are not updated by a launch, as in CUDA); work of streams that joined
// the capture runs on queues the graph owns. Kernel arguments and host functions are what they
// were at capture; memory is read when the launch runs.
class StreamGraph {
 public:
  StreamGraph();
  ~StreamGraph();
  StreamGraph(StreamGraph&&) noexcept;
  StreamGraph& operator=(StreamGraph&&) noexcept;
  // Queues the whole graph on `stream` (of the capture's device kind), after its earlier work;
  // the stream's later work waits for all of it.
  void launch(Stream& stream);
  bool valid() const;

 private:
  friend class Stream;
  Device device_;
  std::shared_ptr<CapturedGraph> captured_;             // CPU and emulated streams
  std::vector<std::unique_ptr<StreamQueue>> branches_;  // one per stream that joined the capture
#if YOLO_CUDA
  cudaGraphExec_t exec_ = nullptr;
#endif
};

class Event {
 public:
  explicit Event(Device device);
  ~Event();
  Event(Event&&) noexcept;
  Event& operator=(Event&&) noexcept;

  bool query() const;        // has the most recently recorded point been reached?
  void synchronize() const;  // host blocks until it has
  // Milliseconds between `start`'s completion and this event's (both recorded and complete).
  float elapsed_ms_since(const Event& start) const;
  Device device() const { return device_; }
  bool valid() const;  // false once moved from; any use then throws yolo::Error
#if YOLO_CUDA
  cudaEvent_t native() const;
#endif

 private:
  friend class Stream;
  Device device_;
  std::shared_ptr<HostEvent> host_;  // CPU and emulated GPUs
#if YOLO_CUDA
  cudaEvent_t cuda_ = nullptr;
#endif
};

class Stream {
 public:
  Stream(Device device, StreamPriority priority = StreamPriority::Normal, std::string name = "");
  ~Stream();  // waits for queued work
  Stream(Stream&&) noexcept;
  Stream& operator=(Stream&&) noexcept;

  void record(Event& event);
  // As record(), and in a capture each launch records `event` itself (CUDA: an external event
  // node, cudaEventRecordExternal), so the host can time a replayed graph's parts after it ran.
  void record_timing(Event& event);
  void wait(const Event& event);
  // Host work in stream order. CPU and emulated GPUs: runs on the stream's thread. CUDA:
  // cudaLaunchHostFunc (the function must not call CUDA, nor touch device memory: emulated
  // GPUs enforce that). Exceptions are kept and rethrown by synchronize().
  void enqueue(std::function<void()> work);
  void synchronize();
  // Stream capture (StreamGraph above): from begin_capture to end_capture the work queued on this
  // stream, and on streams that wait on events recorded in it, is recorded instead of run. While
  // capturing, synchronising or querying it, and waiting on the host for an event recorded in
  // the capture, throw yolo::Error (CUDA refuses them), as does waiting, in the capture, on an
  // event recorded outside it. end_capture throws if a stream that joined was not joined back.
  void begin_capture();
  StreamGraph end_capture();
  bool capturing() const;
  Device device() const { return device_; }
  const std::string& name() const { return name_; }
  bool valid() const;  // false once moved from; any use then throws yolo::Error
  // The stream kernels are launched on: a CUDA stream; in builds with emulated kernels, the
  // queue of a CPU or emulated stream; nullptr otherwise.
  cudaStream_t native() const;
  StreamQueue* queue() const { return queue_.get(); }  // CPU and emulated GPUs, else null

 private:
  Device device_;
  std::string name_;
  std::unique_ptr<StreamQueue> queue_;
#if YOLO_CUDA
  cudaStream_t cuda_ = nullptr;
  struct HostError;
  std::shared_ptr<HostError> host_error_;
#endif
};

// Makes `device` current for the calling thread (CUDA, emulated GPUs); no-op for the CPU.
void set_current_device(Device device);

}  // namespace yolo
