// The socket communicator: collectives open with a frame naming them (so ranks out of step are
// caught), data moves in chunk frames that an abort frame can interrupt, and rank 0 receives
// everything before it sends (so no two ranks wait to send to each other).
#include "runtime/socket_communicator.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <system_error>

#include "runtime/check.h"

namespace yolo {
namespace {

using net::Deadline;
using net::Frame;
using net::Io;
using net::IoResult;
using net::Socket;

enum CommKind : uint32_t { kind_all_reduce = 16, kind_broadcast = 17, kind_all_gather = 18, kind_data = 19 };
constexpr size_t chunk_bytes = size_t(4) << 20;
constexpr size_t chunk_floats = chunk_bytes / sizeof(float);

std::string rank_text(int rank) { return "rank " + std::to_string(rank); }

std::string describe(const Frame& f) {
  std::string head = "#" + std::to_string(f.seq) + " ";
  std::string floats = std::to_string(f.bytes / sizeof(float)) + " floats";
  switch (f.kind) {
    case kind_all_reduce: return head + "all_reduce_sum of " + floats;
    case kind_broadcast: return head + "broadcast of " + floats + " from rank " + std::to_string(f.aux);
    case kind_all_gather: return head + "all_gather";
    case kind_data: return head + "data of " + std::to_string(f.bytes) + " bytes";
    default: return head + "a message of kind " + std::to_string(f.kind);
  }
}

class SocketCommunicator final : public Communicator {
 public:
  SocketCommunicator(Rendezvous&& meeting, double timeout_seconds)
      : rank_(meeting.rank()), world_(meeting.world()), timeout_(timeout_seconds) {
    if (!(timeout_seconds > 0)) throw Error("socket communicator: the timeout (--comm-timeout) must be positive");
    std::vector<Socket> connections = meeting.take_connections();
    if (world_ > 1 && connections.size() != static_cast<size_t>(world_))
      throw Error("socket communicator: the rendezvous has no connections (were they taken already?)");
    for (int r = 0; r < world_; ++r) {
      if (!connections[r].valid()) continue;
      auto peer = std::make_unique<Peer>();
      peer->rank = r;
      peer->socket = std::move(connections[r]);
      peers_.push_back(std::move(peer));
    }
    const size_t expected = world_ == 1 ? 0 : rank_ == 0 ? static_cast<size_t>(world_ - 1) : 1;
    if (peers_.size() != expected)
      throw Error("socket communicator: rank " + std::to_string(rank_) + " has " + std::to_string(peers_.size()) +
                  " connections, not " + std::to_string(expected));
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error("socket communicator: pipe2: " + std::system_category().message(errno));
    wake_read_ = Socket(fds[0]);
    wake_write_ = Socket(fds[1]);
  }

  int rank() const override { return rank_; }
  int size() const override { return world_; }

  void all_reduce_sum(float* data, size_t count, Stream& stream) override {
    stream.enqueue([this, data, count] {
      run({net::frame_magic, kind_all_reduce, 0, count * sizeof(float), 0}, [&](const Op& op) { reduce(op, data, count); });
    });
  }

  void broadcast(float* data, size_t count, int root, Stream& stream) override {
    stream.enqueue([this, data, count, root] {
      run({net::frame_magic, kind_broadcast, 0, count * sizeof(float), static_cast<uint64_t>(root)},
          [&](const Op& op) { send_from_root(op, data, count, root); });
    });
  }

  std::vector<uint64_t> all_gather(uint64_t value) override {
    std::vector<uint64_t> values(world_);
    values[rank_] = value;
    run({net::frame_magic, kind_all_gather, 0, sizeof(uint64_t), value}, [&](const Op& op) { gather(op, values); });
    return values;
  }

  void abort(const std::string& why) override { fail(rank_text(rank_) + " failed: " + why, -1); }
  bool failed() const override { return failed_; }

 private:
  struct Peer {
    int rank = 0;
    Socket socket;
    std::timed_mutex send_mutex;  // one frame at a time: the stream thread's, or an abort's
    bool out_broken = false;      // a frame was cut short: no further frame can follow
  };
  struct Op {
    Frame begin;
    Deadline deadline;
    std::string name;
  };

  // One collective at a time, numbered; any failure aborts the others and throws the first reason.
  template <class Body>
  void run(Frame begin, Body&& body) {
    std::lock_guard lock(op_mutex_);
    throw_if_failed();
    begin.seq = ++seq_;
    Op op{begin, net::deadline_in(timeout_), describe(begin)};
    try {
      body(op);
    } catch (const std::exception& e) {
      fail(e.what(), -1);
      throw Error(failure());
    }
  }

  void reduce(const Op& op, float* data, size_t count) {
    if (world_ == 1) return;
    const size_t bytes = count * sizeof(float);
    if (rank_ != 0) {
      Peer& root = *peers_[0];
      send_frame(root, op.begin, nullptr, op);
      send_chunks(root, data, bytes, op);
      receive_chunks(root, data, bytes, op);
      return;
    }
    gather_begins(op);
    scratch_.resize(std::min(count, chunk_floats));
    // sum = x0; sum += x1; ... in rank order, as the in-process group does: the same bits.
    for (size_t offset = 0; offset < count; offset += chunk_floats) {
      const size_t n = std::min(chunk_floats, count - offset);
      float* out = data + offset;
      for (auto& peer : peers_) {
        receive_data(*peer, scratch_.data(), n * sizeof(float), op);
        for (size_t i = 0; i < n; ++i) out[i] += scratch_[i];
      }
    }
    send_to_all(data, bytes, -1, op);
  }

  void send_from_root(const Op& op, float* data, size_t count, int root) {
    if (root < 0 || root >= world_)
      throw Error("broadcast: root " + std::to_string(root) + " is outside 0.." + std::to_string(world_ - 1));
    const size_t bytes = count * sizeof(float);
    if (rank_ != 0) {
      Peer& hub = *peers_[0];
      send_frame(hub, op.begin, nullptr, op);
      if (rank_ == root) send_chunks(hub, data, bytes, op);
      else receive_chunks(hub, data, bytes, op);
      return;
    }
    gather_begins(op);
    if (root != 0) receive_chunks(*peers_[root - 1], data, bytes, op);
    send_to_all(data, bytes, root, op);
  }

  void gather(const Op& op, std::vector<uint64_t>& values) {
    const size_t bytes = values.size() * sizeof(uint64_t);
    if (rank_ != 0) {
      send_frame(*peers_[0], op.begin, nullptr, op);
      receive_chunks(*peers_[0], values.data(), bytes, op);
      return;
    }
    std::vector<Frame> begins = gather_begins(op);
    for (int r = 1; r < world_; ++r) values[r] = begins[r].aux;
    send_to_all(values.data(), bytes, -1, op);
  }

  // Rank 0: every other rank's opening frame, taken as they come (a rank that aborts is heard
  // at once, whatever the others do); a different call on any rank is an error naming both.
  std::vector<Frame> gather_begins(const Op& op) {
    std::vector<Frame> begins(world_);
    std::vector<bool> have(world_, false);
    int missing = world_ - 1;
    std::vector<pollfd> fds;
    std::vector<Peer*> polled;
    while (missing > 0) {
      fds.clear();
      polled.clear();
      for (auto& peer : peers_)
        if (!have[peer->rank]) {
          fds.push_back({peer->socket.fd(), POLLIN, 0});
          polled.push_back(peer.get());
        }
      fds.push_back({wake_read_.fd(), POLLIN, 0});
      if (net::poll_until(fds.data(), fds.size(), op.deadline) == 0) {
        std::string names;
        for (int r = 1; r < world_; ++r)
          if (!have[r]) names += (names.empty() ? "" : ", ") + std::to_string(r);
        throw Error(rank_text(rank_) + " waited " + seconds_text() + " in " + op.name + " for " +
                    (missing == 1 ? "rank " : "ranks ") + names + ", which never joined it (--comm-timeout)");
      }
      if (fds.back().revents) throw Error(failure());
      for (size_t i = 0; i < polled.size(); ++i) {
        if (!fds[i].revents) continue;
        Peer& peer = *polled[i];
        Frame got = read_frame(peer, op);
        bool same = got.kind == op.begin.kind && got.seq == op.begin.seq && got.bytes == op.begin.bytes &&
                    (got.kind == kind_all_gather || got.aux == op.begin.aux);
        if (!same)
          throw Error("collective mismatch: rank 0 calls " + op.name + ", " + rank_text(peer.rank) + " calls " +
                      describe(got) + "; every rank must make the same collective calls in the same order");
        begins[peer.rank] = got;
        have[peer.rank] = true;
        --missing;
      }
    }
    return begins;
  }

  // Rank 0: `bytes` to every other rank but `skip`, chunk by chunk so all of them progress.
  void send_to_all(const void* data, size_t bytes, int skip, const Op& op) {
    const char* from = static_cast<const char*>(data);
    for (size_t offset = 0; offset < bytes; offset += chunk_bytes) {
      Frame chunk{net::frame_magic, kind_data, op.begin.seq, std::min(chunk_bytes, bytes - offset), 0};
      for (auto& peer : peers_)
        if (peer->rank != skip) send_frame(*peer, chunk, from + offset, op);
    }
  }

  void send_chunks(Peer& peer, const void* data, size_t bytes, const Op& op) {
    const char* from = static_cast<const char*>(data);
    for (size_t offset = 0; offset < bytes; offset += chunk_bytes) {
      Frame chunk{net::frame_magic, kind_data, op.begin.seq, std::min(chunk_bytes, bytes - offset), 0};
      send_frame(peer, chunk, from + offset, op);
    }
  }

  void receive_chunks(Peer& peer, void* data, size_t bytes, const Op& op) {
    char* to = static_cast<char*>(data);
    for (size_t offset = 0; offset < bytes; offset += chunk_bytes)
      receive_data(peer, to + offset, std::min(chunk_bytes, bytes - offset), op);
  }

  void receive_data(Peer& peer, void* data, size_t bytes, const Op& op) {
    Frame got = read_frame(peer, op);
    if (got.kind != kind_data || got.seq != op.begin.seq || got.bytes != bytes)
      throw Error(rank_text(peer.rank) + " sent " + describe(got) + " where " + rank_text(rank_) + " expected " +
                  std::to_string(bytes) + " bytes of " + op.name + " (the ranks are out of step)");
    IoResult result = net::recv_all(peer.socket.fd(), data, bytes, op.deadline, wake_read_.fd());
    if (result.status != Io::done) trouble(peer, result, op);
  }

  // An opening frame (no payload), or a data frame and its frame.bytes of payload.
  void send_frame(Peer& peer, const Frame& frame, const void* payload, const Op& op) {
    std::unique_lock lock(peer.send_mutex);
    throw_if_failed();
    const int fd = peer.socket.fd();
    IoResult result = net::send_all(fd, &frame, sizeof frame, op.deadline, wake_read_.fd(), true);
    size_t moved = result.moved;
    if (result.status == Io::done && frame.kind == kind_data && frame.bytes > 0) {
      result = net::send_all(fd, payload, frame.bytes, op.deadline, wake_read_.fd(), true);
      moved += result.moved;
    }
    if (result.status == Io::done) return;
    if (moved > 0) peer.out_broken = true;
    lock.unlock();
    trouble(peer, result, op);
  }

  // The next frame from `peer`; an abort frame throws its reason (and passes it on).
  Frame read_frame(Peer& peer, const Op& op) {
    Frame frame{};
    IoResult result = net::recv_all(peer.socket.fd(), &frame, sizeof frame, op.deadline, wake_read_.fd());
    if (result.status != Io::done) trouble(peer, result, op);
    if (frame.magic != net::frame_magic)
      fail_and_throw(rank_text(peer.rank) + " sent a malformed message during " + op.name +
                     " (framing lost: a mismatched build?)", -1);
    if (frame.kind == net::frame_abort) fail_and_throw(abort_reason(peer, frame), peer.rank);
    return frame;
  }

  std::string abort_reason(Peer& peer, const Frame& frame) {
    if (frame.bytes > net::max_abort_reason) return rank_text(peer.rank) + " sent a malformed abort message";
    std::string reason(frame.bytes, '\0');
    IoResult result = net::recv_all(peer.socket.fd(), reason.data(), reason.size(), net::deadline_in(1.0));
    if (result.status != Io::done) return rank_text(peer.rank) + " aborted (its reason was lost)";
    return reason;
  }

  // A peer whose connection closed may have said why just before: its abort frame is still here.
  std::string parting_words(Peer& peer) {
    Frame frame{};
    if (net::recv_all(peer.socket.fd(), &frame, sizeof frame, net::deadline_in(0.1)).status != Io::done) return "";
    if (frame.magic != net::frame_magic || frame.kind != net::frame_abort) return "";
    return abort_reason(peer, frame);
  }

  [[noreturn]] void trouble(Peer& peer, const IoResult& result, const Op& op) {
    switch (result.status) {
      case Io::woken:
        throw Error(failure());
      case Io::timed_out:
        fail_and_throw(rank_text(rank_) + " waited " + seconds_text() + " in " + op.name + " for " +
                       rank_text(peer.rank) + " (--comm-timeout)", -1);
      case Io::input: {
        // While we send, a peer may only abort; read_frame throws its reason.
        Frame frame = read_frame(peer, op);
        fail_and_throw(rank_text(peer.rank) + " sent " + describe(frame) + " while " + rank_text(rank_) +
                       " was sending " + op.name + " (the ranks are out of step)", -1);
      }
      case Io::closed:
      case Io::done:
        break;
    }
    std::string reason = parting_words(peer);
    if (reason.empty())
      reason = rank_text(peer.rank) + " went away (" + net::describe_close(result) + ") during " + op.name;
    fail_and_throw(reason, peer.rank);
  }

  [[noreturn]] void fail_and_throw(const std::string& reason, int quiet_rank) {
    fail(reason, quiet_rank);
    throw Error(failure());
  }

  // Records the first failure, wakes this rank's waits, and tells the peers (but `quiet_rank`,
  // which told us or is gone); rank 0 so passes a rank's abort on to all the others.
  void fail(const std::string& reason, int quiet_rank) {
    {
      std::lock_guard lock(state_mutex_);
      if (failed_) return;
      failure_ = reason;
      failed_ = true;
    }
    // Never drained: once failed, every later wait wakes at once.
    const char byte = 1;
    ssize_t written;
    do written = ::write(wake_write_.fd(), &byte, 1);
    while (written < 0 && errno == EINTR);
    const int wake_error = written < 0 ? errno : 0;
    for (auto& peer : peers_)
      if (peer->rank != quiet_rank) tell_abort(*peer, reason);
    if (wake_error != 0)
      throw Error("socket communicator: cannot wake the waiting thread: " + std::system_category().message(wake_error));
  }

  void tell_abort(Peer& peer, const std::string& reason) {
    std::unique_lock lock(peer.send_mutex, std::defer_lock);
    // The stream thread holds the lock for one frame at most; the wake-up makes it let go.
    if (lock.try_lock_for(std::chrono::milliseconds(500)) && !peer.out_broken) {
      Frame frame{net::frame_magic, net::frame_abort, 0, std::min(reason.size(), net::max_abort_reason), 0};
      Deadline deadline = net::deadline_in(1.0);
      IoResult sent = net::send_all(peer.socket.fd(), &frame, sizeof frame, deadline);
      if (sent.status == Io::done) sent = net::send_all(peer.socket.fd(), reason.data(), frame.bytes, deadline);
      if (sent.status == Io::done) return;
      peer.out_broken = true;
    }
    // It cannot be told why, but closing our side ends its wait at once. This fails only
    // when the connection is gone already, which ends its wait as well.
    ::shutdown(peer.socket.fd(), SHUT_RDWR);
  }

  void throw_if_failed() {
    if (failed_) throw Error(failure());
  }

  std::string failure() {
    std::lock_guard lock(state_mutex_);
    return failure_;
  }

  std::string seconds_text() const {
    char text[32];
    std::snprintf(text, sizeof text, "%g s", timeout_);
    return text;
  }

  const int rank_, world_;
  const double timeout_;
  std::vector<std::unique_ptr<Peer>> peers_;  // in rank order: rank 0 has ranks 1..N-1, the others rank 0
  Socket wake_read_, wake_write_;
  std::mutex op_mutex_;
  uint64_t seq_ = 0;
  std::vector<float> scratch_;
  std::mutex state_mutex_;
  std::atomic<bool> failed_{false};
  std::string failure_;
};

}  // namespace

std::unique_ptr<Communicator> socket_communicator(Rendezvous&& connected, double timeout_seconds) {
  return std::make_unique<SocketCommunicator>(std::move(connected), timeout_seconds);
}

}  // namespace yolo
