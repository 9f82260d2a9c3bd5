// Where the ranks of a multi-process job meet (--rendezvous): a barrier over a star of TCP
// connections around rank 0, which can then hand its bytes (the NCCL unique id) to every rank;
// the connections stay open for the socket communicator, which shares the I/O and wire format.
#pragma once
#include <poll.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace yolo {

namespace net {

using Deadline = std::chrono::steady_clock::time_point;
Deadline deadline_in(double seconds);

// An owned socket (or pipe) descriptor, closed on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

enum class Io {
  done,       // every byte moved
  closed,     // the peer closed or reset the connection
  timed_out,  // the deadline passed first
  woken,      // wake_fd became readable (this rank aborted)
  input,      // (send with stop_on_input) the peer sent something while we were sending
};
struct IoResult {
  Io status = Io::done;
  int error = 0;     // with `closed`: the errno behind it, 0 for an orderly close
  size_t moved = 0;  // bytes sent or received before it stopped
};

// Move exactly `size` bytes over a non-blocking socket, waiting with poll() until `deadline`.
// A wake_fd (>= 0) is watched too, so another thread can interrupt the wait. System errors
// other than a lost connection throw yolo::Error.
IoResult send_all(int fd, const void* data, size_t size, Deadline deadline, int wake_fd = -1,
                  bool stop_on_input = false);
IoResult recv_all(int fd, void* data, size_t size, Deadline deadline, int wake_fd = -1);
// "connection closed" or "connection lost: <errno text>" for a `closed` result.
std::string describe_close(const IoResult& result);
// poll() until something is ready (returns the count) or the deadline passes (returns 0).
int poll_until(pollfd* fds, size_t count, Deadline deadline);

// Every message after the handshake starts with a Frame (host byte order: the ranks run the
// same build on the same kind of machine).
struct Frame {
  uint32_t magic;
  uint32_t kind;
  uint64_t seq;    // which collective (the communicator numbers them)
  uint64_t bytes;  // payload bytes that follow; a collective's opening frame: its size (none follow)
  uint64_t aux;    // kind-specific: a broadcast's root, an all_gather's value
};
static_assert(sizeof(Frame) == 32);
constexpr uint32_t frame_magic = 0x464c4f59;  // "YOLF" in memory
// Kinds the rendezvous uses; the socket communicator's start at 16.
enum FrameKind : uint32_t { frame_welcome = 1, frame_bytes = 2, frame_abort = 3 };
constexpr size_t max_abort_reason = 4096;

// The first bytes a joining rank sends; anything else makes rank 0 drop the connection.
struct Hello {
  uint64_t magic;
  uint32_t rank;
  uint32_t world;
};
static_assert(sizeof(Hello) == 16);
constexpr uint64_t hello_magic = 0x317664724f4c4f59ULL;  // "YOLOrdv1" in memory: protocol version 1

}  // namespace net

// A parsed --rendezvous value.
struct RendezvousSpec {
  bool file = false;  // file:///path, else tcp://host:port
  std::string host;   // tcp
  int port = 0;       // tcp
  std::string path;   // file
};
// Accepts tcp://HOST:PORT (HOST a name, an IPv4 address or [IPv6]; PORT 1..65535) and
// file:///ABSOLUTE/PATH; anything else throws yolo::Error naming the value and these forms.
RendezvousSpec parse_rendezvous(const std::string& spec);

class Rendezvous {
 public:
  // tcp://host:port: rank 0 listens on `port` on all interfaces, the others connect to
  // host:port, retrying until the timeout (rank 0 may start later). file:///path: rank 0
  // listens on an ephemeral port and publishes "host:port" in the file (host: the env
  // variable YOLO_RENDEZVOUS_HOST, else this machine's name); the others wait for the file,
  // then connect. Rank 0 removes the file when it is done with it; a file already there when
  // rank 0 starts is an error (a stale one would send the ranks to a dead address).
  // Blocks until all `world` ranks have joined (a barrier) or timeout_seconds passed; rank 0
  // then names the ranks that never joined, and tells the others why it gives up.
  static Rendezvous join(const std::string& spec, int rank, int world, double timeout_seconds);

  Rendezvous(Rendezvous&&) noexcept = default;
  Rendezvous& operator=(Rendezvous&&) noexcept = default;
  ~Rendezvous() = default;  // the sockets close themselves

  // rank 0's bytes to every rank (e.g. the NCCL unique id); other ranks pass anything (their
  // argument is ignored). Same timeout as join; a lost rank 0 throws "rank 0 went away".
  std::vector<uint8_t> broadcast_bytes(const std::vector<uint8_t>& from_rank0);

  int rank() const { return rank_; }
  int world() const { return world_; }
  const std::string& spec() const { return spec_; }
  // The open connections, indexed by rank: rank 0 has one to every other rank; the others
  // only one, to rank 0 (index 0). Missing entries are invalid Sockets. Leaves none here.
  std::vector<net::Socket> take_connections();

 private:
  Rendezvous(std::string spec, int rank, int world, double timeout_seconds);
  void host(const RendezvousSpec& where, net::Deadline deadline);
  void guest(const RendezvousSpec& where, net::Deadline deadline);
  [[noreturn]] void abandon(const std::string& reason);

  std::string spec_;
  int rank_ = 0, world_ = 1;
  double timeout_ = 0;
  std::vector<net::Socket> peers_;  // by rank
};

}  // namespace yolo
