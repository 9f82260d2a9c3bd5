// Stream capture and graph replay (stream.h's StreamGraph): CUDA Graphs on CUDA streams; on CPU and
// emulated streams the capture of their queues (stream_queue.h) replayed item by item.
#include <map>
#include <string>
#include <utility>

#include "runtime/check.h"
#include "runtime/stream.h"
#include "runtime/stream_queue.h"

namespace yolo {

void Stream::begin_capture() {
  if (!valid()) throw Error("begin_capture: the stream was moved from");
  if (queue_) {
    queue_->begin_capture();
    return;
  }
#if YOLO_CUDA
  // Thread-local mode: another thread's unsafe calls (a cudaMalloc, a synchronise) do not break
  // this capture; one thread per GPU captures its own.
  CHECKED(cudaStreamBeginCapture(cuda_, cudaStreamCaptureModeThreadLocal));
#endif
}

void Stream::record_timing(Event& event) {
  if (!valid()) throw Error("record_timing: the stream was moved from");
  if (!event.valid()) throw Error("record_timing: the event was moved from");
  if (event.device() != device_)
    throw Error("stream '" + name_ + "' on " + device_.name() + " cannot record an event of " + event.device().name());
  if (queue_) {
    queue_->record(event.host_, /*external=*/true);
    return;
  }
#if YOLO_CUDA
  if (capturing())
    CHECKED(cudaEventRecordWithFlags(event.cuda_, cuda_, cudaEventRecordExternal));
  else
    CHECKED(cudaEventRecord(event.cuda_, cuda_));
#endif
}

bool Stream::capturing() const {
  if (!valid()) return false;
  if (queue_) return queue_->capturing();
#if YOLO_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CHECKED(cudaStreamIsCapturing(cuda_, &status));
  return status == cudaStreamCaptureStatusActive;
#else
  return false;
#endif
}

StreamGraph Stream::end_capture() {
  if (!valid()) throw Error("end_capture: the stream was moved from");
  StreamGraph graph;
  graph.device_ = device_;
  if (queue_) {
    graph.captured_ = queue_->end_capture();
    for (size_t q = 1; q < graph.captured_->queues.size(); ++q) {
      const StreamQueue& joined = *graph.captured_->queues[q].first;
      graph.branches_.push_back(
          std::make_unique<StreamQueue>(joined.name() + " (graph)", joined.emulated_device(), joined.high_priority()));
    }
    return graph;
  }
#if YOLO_CUDA
  cudaGraph_t captured = nullptr;
  CHECKED(cudaStreamEndCapture(cuda_, &captured));
  cudaError_t status = cudaGraphInstantiate(&graph.exec_, captured, 0);
  cudaGraphDestroy(captured);
  CHECKED(status);
#endif
  return graph;
}

StreamGraph::StreamGraph() = default;

StreamGraph::~StreamGraph() {
  branches_.clear();  // each runs what was queued on it first
#if YOLO_CUDA
  if (exec_) cudaGraphExecDestroy(exec_);
#endif
}

StreamGraph::StreamGraph(StreamGraph&& other) noexcept
    : device_(other.device_), captured_(std::move(other.captured_)), branches_(std::move(other.branches_)) {
#if YOLO_CUDA
  exec_ = std::exchange(other.exec_, nullptr);
#endif
}

StreamGraph& StreamGraph::operator=(StreamGraph&& other) noexcept {
  if (this != &other) {
    this->~StreamGraph();
    new (this) StreamGraph(std::move(other));
  }
  return *this;
}

bool StreamGraph::valid() const {
#if YOLO_CUDA
  if (exec_) return true;
#endif
  return captured_ != nullptr;
}

void StreamGraph::launch(Stream& stream) {
  if (!valid()) throw Error("StreamGraph::launch: an empty graph (not captured, or moved from)");
  if (stream.device().kind != device_.kind)
    throw Error("StreamGraph::launch: a graph captured on " + device_.name() + " cannot run on stream '" +
                stream.name() + "' of " + stream.device().name());
  if (captured_) {
    StreamQueue* target = stream.queue();
    // Fresh events for the capture's records: each launch's dependencies are its own.
    std::map<std::pair<const HostEvent*, uint64_t>, std::shared_ptr<HostEvent>> fresh;
    auto fresh_of = [&](const StreamQueue::Item& item) -> const std::shared_ptr<HostEvent>& {
      std::shared_ptr<HostEvent>& event = fresh[{item.event.get(), item.generation}];
      if (!event) event = make_host_event();
      return event;
    };
    for (size_t q = 0; q < captured_->queues.size(); ++q) {
      StreamQueue& on = q == 0 ? *target : *branches_[q - 1];
      for (const StreamQueue::Item& item : captured_->queues[q].second) {
        switch (item.kind) {
          case StreamQueue::Item::Kind::Work:
            if (item.replay)
              item.replay(on);
            else
              on.push(item.work);
            break;
          case StreamQueue::Item::Kind::Record:
            on.record(fresh_of(item));  // its generation 1
            if (item.external) on.record(item.event);
            break;
          case StreamQueue::Item::Kind::Wait:
            on.wait(fresh_of(item), 1);
            break;
        }
      }
    }
    return;
  }
#if YOLO_CUDA
  CHECKED(cudaGraphLaunch(exec_, stream.native()));
#endif
}

}  // namespace yolo
