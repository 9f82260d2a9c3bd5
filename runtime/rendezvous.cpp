// The rendezvous (see rendezvous.h): rank 0 runs one poll() loop over its listener, the
// half-done handshakes and the ranks already joined, so strangers and slow ranks cannot stall
// it; the others resolve and connect with retries. Every wait has a deadline.
#include "runtime/rendezvous.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "runtime/check.h"

namespace yolo {
namespace net {
namespace {

std::string errno_text(int error) { return std::system_category().message(error); }

int remaining_ms(Deadline deadline) {
  auto left = deadline - std::chrono::steady_clock::now();
  if (left <= left.zero()) return 0;
  long long ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, 1 << 30));
}

bool connection_lost(int error) {
  return error == ECONNRESET || error == EPIPE || error == ECONNABORTED || error == ETIMEDOUT ||
         error == EHOSTUNREACH || error == ENETUNREACH || error == ENETDOWN;
}

// Waits until `fd` is ready for `events`: done, or timed_out / woken (wake_fd readable) / input
// (POLLIN was asked for together with POLLOUT and the peer sent something).
Io wait_ready(int fd, short events, Deadline deadline, int wake_fd) {
  pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
  int ready = poll_until(fds, wake_fd >= 0 ? 2 : 1, deadline);
  if (ready == 0) return Io::timed_out;
  if (wake_fd >= 0 && fds[1].revents) return Io::woken;
  if ((events & POLLOUT) && (events & POLLIN) && (fds[0].revents & POLLIN)) return Io::input;
  return Io::done;  // ready, or failed: the next send/recv says which
}

}  // namespace

Deadline deadline_in(double seconds) {
  seconds = std::clamp(seconds, 0.0, 1e7);  // beyond ~100 days the clock's nanoseconds would overflow
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

int poll_until(pollfd* fds, size_t count, Deadline deadline) {
  for (;;) {
    int ready = ::poll(fds, count, remaining_ms(deadline));
    if (ready > 0) return ready;
    if (ready == 0 && remaining_ms(deadline) == 0) return 0;
    if (ready < 0 && errno != EINTR) throw Error("poll: " + errno_text(errno));
  }
}

Socket::~Socket() {
  // Nothing to report from a destructor: after a failed close() the descriptor is gone anyway.
  if (fd_ >= 0) ::close(fd_);
}

Socket::Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Socket old(std::exchange(fd_, std::exchange(other.fd_, -1)));
  }
  return *this;
}

IoResult send_all(int fd, const void* data, size_t size, Deadline deadline, int wake_fd, bool stop_on_input) {
  const char* bytes = static_cast<const char*>(data);
  IoResult result;
  while (result.moved < size) {
    ssize_t sent = ::send(fd, bytes + result.moved, size - result.moved, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      result.moved += static_cast<size_t>(sent);
      continue;
    }
    int error = errno;
    if (error == EINTR) continue;
    if (connection_lost(error)) return {Io::closed, error, result.moved};
    if (error != EAGAIN && error != EWOULDBLOCK) throw Error("send: " + errno_text(error));
    short events = static_cast<short>(POLLOUT | (stop_on_input ? POLLIN : 0));
    if (Io waited = wait_ready(fd, events, deadline, wake_fd); waited != Io::done) {
      result.status = waited;
      return result;
    }
  }
  return result;
}

IoResult recv_all(int fd, void* data, size_t size, Deadline deadline, int wake_fd) {
  char* bytes = static_cast<char*>(data);
  IoResult result;
  while (result.moved < size) {
    ssize_t got = ::recv(fd, bytes + result.moved, size - result.moved, MSG_DONTWAIT);
    if (got > 0) {
      result.moved += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return {Io::closed, 0, result.moved};
    int error = errno;
    if (error == EINTR) continue;
    if (connection_lost(error)) return {Io::closed, error, result.moved};
    if (error != EAGAIN && error != EWOULDBLOCK) throw Error("recv: " + errno_text(error));
    if (Io waited = wait_ready(fd, POLLIN, deadline, wake_fd); waited != Io::done) {
      result.status = waited;
      return result;
    }
  }
  return result;
}

std::string describe_close(const IoResult& result) {
  return result.error == 0 ? "connection closed" : "connection lost: " + errno_text(result.error);
}

}  // namespace net

namespace {

using net::Deadline;
using net::Frame;
using net::Io;
using net::IoResult;
using net::Socket;

std::string errno_text(int error) { return std::system_category().message(error); }

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", seconds);
  return text;
}

std::string rank_text(int rank) { return "rank " + std::to_string(rank); }

// "HOST:PORT" or "[IPV6]:PORT" into its parts; returns what is wrong, or "" when it is fine.
std::string split_host_port(const std::string& text, std::string& host, int& port) {
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) return "the IPv6 address has no closing ']'";
    host = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':') return "no :PORT after the host";
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) return "no :PORT after the host";
    host = text.substr(0, colon);
    if (host.find(':') != std::string::npos) return "an IPv6 address needs brackets: [ADDRESS]:PORT";
    port_text = text.substr(colon + 1);
  }
  if (host.empty()) return "no host before the :PORT";
  bool digits = !port_text.empty() && port_text.size() <= 5 &&
                std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; });
  port = digits ? std::stoi(port_text) : 0;
  if (port < 1 || port > 65535) return "port '" + port_text + "' is not a number in 1..65535";
  return "";
}

std::string join_host_port(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

void set_no_delay(int fd) {
  int on = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) != 0)
    throw Error("setsockopt(TCP_NODELAY): " + errno_text(errno));
}

// A listening socket on `port` (0: any free one) of every interface, IPv4 and, where the
// machine has it, IPv6. Returns an invalid Socket with errno set when the family is unusable.
Socket try_listen(int family, int port) {
  Socket s(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.valid()) return s;
  int on = 1, off = 0;
  if (::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0) return Socket();
  sockaddr_storage address{};
  socklen_t length = 0;
  if (family == AF_INET6) {
    if (::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) != 0) return Socket();
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&address);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_any;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in6);
  } else {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&address);
    in4->sin_family = AF_INET;
    in4->sin_addr.s_addr = htonl(INADDR_ANY);
    in4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in);
  }
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&address), length) != 0) return Socket();
  if (::listen(s.fd(), 512) != 0) return Socket();
  return s;
}

Socket listen_on(int port, const std::string& spec) {
  Socket s = try_listen(AF_INET6, port);
  // A machine without IPv6 fails with the family's errors; a busy port fails either way.
  if (!s.valid() && errno != EADDRINUSE && errno != EACCES) s = try_listen(AF_INET, port);
  if (!s.valid()) {
    int error = errno;
    std::string hint = error == EADDRINUSE ? " (another job, or a rank 0 of an earlier run that is still alive, holds "
                                             "it: pick another port in MASTER_PORT or --rendezvous)"
                                           : "";
    throw Error("rank 0 cannot listen on port " + std::to_string(port) + " for --rendezvous " + spec + ": " +
                errno_text(error) + hint);
  }
  return s;
}

int local_port(const Socket& s) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw Error("getsockname: " + errno_text(errno));
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

// A connect() to a free port in the ephemeral range can meet itself (TCP simultaneous open).
bool connected_to_itself(int fd) {
  sockaddr_storage mine{}, theirs{};
  socklen_t mine_length = sizeof mine, their_length = sizeof theirs;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_length) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &their_length) != 0)
    return false;  // not connected after all: the first read or write will say so
  return mine_length == their_length && std::memcmp(&mine, &theirs, mine_length) == 0;
}

// One round of attempts at every address of host:port; an invalid Socket and `why` on failure.
Socket connect_once(const std::string& host, int port, Deadline deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (status != 0) {
    why = "cannot resolve '" + host + "': " + (status == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(status));
    return Socket();
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  for (addrinfo* a = list.get(); a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      why = "socket: " + errno_text(errno);
      continue;
    }
    if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS && errno != EINTR) {
        why = errno_text(errno);
        continue;
      }
      pollfd wait{s.fd(), POLLOUT, 0};
      if (net::poll_until(&wait, 1, deadline) == 0) {
        why = "the connection attempt timed out";
        continue;
      }
      int error = 0;
      socklen_t length = sizeof error;
      if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
      if (error != 0) {
        why = errno_text(error);
        continue;
      }
    }
    if (connected_to_itself(s.fd())) {
      why = errno_text(ECONNREFUSED);
      continue;
    }
    set_no_delay(s.fd());
    return s;
  }
  return Socket();
}

// The name rank 0 publishes for file://; the other ranks resolve it themselves.
std::string published_host(const std::string& spec) {
  if (const char* chosen = std::getenv("YOLO_RENDEZVOUS_HOST")) {
    if (!*chosen) throw Error("YOLO_RENDEZVOUS_HOST is set but empty: set it to this machine's address or unset it");
    return chosen;
  }
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) throw Error("gethostname: " + errno_text(errno));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int status = ::getaddrinfo(name, nullptr, &hints, &found);
  if (status != 0)
    throw Error("rank 0 cannot publish its address for --rendezvous " + spec + ": this machine's name '" + name +
                "' does not resolve (" + (status == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(status)) +
                "); set YOLO_RENDEZVOUS_HOST to an address of this machine that the other ranks can reach");
  ::freeaddrinfo(found);
  return name;
}

// The file:// address file: written under a temporary name and renamed into place, so no rank
// reads half of it; removed when rank 0 is done (all joined, or it gave up).
class PublishedAddress {
 public:
  PublishedAddress(const std::string& path, const std::string& text) {
    std::string temp = path + ".tmp." + std::to_string(::getpid());
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      throw Error("rank 0 cannot write the rendezvous file " + temp + ": " + errno_text(errno) +
                  " (the folder must exist and be shared by all ranks)");
    size_t written = 0;
    int error = 0;
    while (written < text.size() && error == 0) {
      ssize_t n = ::write(fd, text.data() + written, text.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      else if (errno != EINTR) error = errno;
    }
    if (::close(fd) != 0 && error == 0) error = errno;
    if (error == 0 && ::rename(temp.c_str(), path.c_str()) != 0) error = errno;
    if (error != 0) {
      ::unlink(temp.c_str());  // best effort: the error below is what matters
      throw Error("rank 0 cannot publish its address in " + path + ": " + errno_text(error));
    }
    path_ = path;
  }
  // Unchecked on purpose: a file left behind is reported, by name, by the next run's rank 0.
  ~PublishedAddress() { ::unlink(path_.c_str()); }
  PublishedAddress(const PublishedAddress&) = delete;
  PublishedAddress& operator=(const PublishedAddress&) = delete;

 private:
  std::string path_;
};

// Waits for rank 0's file and returns its "host:port" line.
std::string read_published(const std::string& path, Deadline deadline, int rank, const std::string& spec,
                           double timeout) {
  for (;;) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      std::string text;
      char buffer[512];
      int error = 0;
      for (;;) {
        ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n > 0 && text.size() < 4096) text.append(buffer, static_cast<size_t>(n));
        else if (n == 0 || text.size() >= 4096) break;
        else if (errno != EINTR) {
          error = errno;
          break;
        }
      }
      ::close(fd);  // read-only: nothing can be lost
      if (error != 0) throw Error(rank_text(rank) + " cannot read the rendezvous file " + path + ": " + errno_text(error));
      while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
      return text;
    }
    if (errno != ENOENT && errno != EINTR)
      throw Error(rank_text(rank) + " cannot open the rendezvous file " + path + ": " + errno_text(errno));
    if (std::chrono::steady_clock::now() >= deadline)
      throw Error(rank_text(rank) + " waited " + seconds_text(timeout) + " for rank 0 to publish its address in " +
                  path + " (--rendezvous " + spec + "): rank 0 did not start or failed, or the path is not on a " +
                  "file system that all ranks share");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20, std::max(1, net::remaining_ms(deadline)))));
  }
}

// The reason text of an abort frame whose header has been read.
std::string read_abort_reason(int fd, const Frame& frame, Deadline deadline, const std::string& from) {
  if (frame.bytes > net::max_abort_reason) throw Error(from + " sent a malformed abort message");
  std::string reason(frame.bytes, '\0');
  IoResult got = net::recv_all(fd, reason.data(), reason.size(), deadline);
  if (got.status != Io::done) return from + " gave up (its reason was lost: " + net::describe_close(got) + ")";
  return reason;
}

}  // namespace

RendezvousSpec parse_rendezvous(const std::string& spec) {
  auto bad = [&](const std::string& why) {
    return Error("--rendezvous '" + spec + "': " + why +
                 "; expected tcp://HOST:PORT (PORT 1..65535, HOST a name, an address or [IPv6]) or "
                 "file:///ABSOLUTE/PATH on a file system all ranks share");
  };
  RendezvousSpec parsed;
  if (spec.rfind("tcp://", 0) == 0) {
    std::string problem = split_host_port(spec.substr(6), parsed.host, parsed.port);
    if (!problem.empty()) throw bad(problem);
  } else if (spec.rfind("file://", 0) == 0) {
    parsed.file = true;
    parsed.path = spec.substr(7);
    if (parsed.path.empty() || parsed.path.front() != '/')
      throw bad("the path must be absolute (file:// then /path: three slashes)");
    if (parsed.path.back() == '/') throw bad("the path names a folder; name a file in it");
  } else {
    throw bad("unknown form");
  }
  return parsed;
}

Rendezvous::Rendezvous(std::string spec, int rank, int world, double timeout_seconds)
    : spec_(std::move(spec)), rank_(rank), world_(world), timeout_(timeout_seconds), peers_(world) {}

Rendezvous Rendezvous::join(const std::string& spec, int rank, int world, double timeout_seconds) {
  if (world < 1) throw Error("rendezvous: the world size must be 1 or more, not " + std::to_string(world));
  if (rank < 0 || rank >= world)
    throw Error("rendezvous: rank " + std::to_string(rank) + " is outside 0.." + std::to_string(world - 1));
  if (!(timeout_seconds > 0)) throw Error("rendezvous: the timeout (--comm-timeout) must be positive");
  RendezvousSpec where = parse_rendezvous(spec);
  Rendezvous meeting(spec, rank, world, timeout_seconds);
  if (world == 1) return meeting;
  Deadline deadline = net::deadline_in(timeout_seconds);
  if (rank == 0) meeting.host(where, deadline);
  else meeting.guest(where, deadline);
  return meeting;
}

void Rendezvous::abandon(const std::string& reason) {
  // Tell every joined rank why, so they stop now with the real reason, not at their timeout
  // (best effort: one that cannot be told still stops, at its own timeout).
  Frame frame{net::frame_magic, net::frame_abort, 0, std::min(reason.size(), net::max_abort_reason), 0};
  Deadline deadline = net::deadline_in(1.0);
  for (Socket& peer : peers_) {
    if (!peer.valid()) continue;
    if (net::send_all(peer.fd(), &frame, sizeof frame, deadline).status == Io::done)
      net::send_all(peer.fd(), reason.data(), frame.bytes, deadline);
  }
  peers_.clear();
  throw Error(reason);
}

void Rendezvous::host(const RendezvousSpec& where, Deadline deadline) {
  Socket listener = listen_on(where.file ? 0 : where.port, spec_);
  std::optional<PublishedAddress> published;
  std::string place = spec_;
  if (where.file) {
    struct stat info {};
    if (::lstat(where.path.c_str(), &info) == 0)
      throw Error("rank 0: the rendezvous file " + where.path + " (--rendezvous " + spec_ +
                  ") already exists: a stale file from an earlier job would send the ranks to a dead address; "
                  "remove it or pick a new path");
    if (errno != ENOENT) throw Error("rank 0 cannot check the rendezvous file " + where.path + ": " + errno_text(errno));
    std::string address = join_host_port(published_host(spec_), local_port(listener));
    published.emplace(where.path, address + "\n");
    place = spec_ + " (" + address + ")";
  }

  struct Pending {
    Socket socket;
    net::Hello hello{};
    size_t got = 0;
  };
  std::deque<Pending> pending;
  const size_t max_pending = static_cast<size_t>(world_) + 64;  // strangers beyond this are dropped, oldest first
  int joined = 0;
  std::vector<pollfd> fds;
  while (joined < world_ - 1) {
    fds.clear();
    fds.push_back({listener.fd(), POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.socket.fd(), POLLIN, 0});
    for (const Socket& peer : peers_)
      if (peer.valid()) fds.push_back({peer.fd(), POLLIN, 0});
    if (net::poll_until(fds.data(), fds.size(), deadline) == 0) {
      std::string missing;
      int count = 0;
      for (int r = 1; r < world_; ++r)
        if (!peers_[r].valid()) missing += (count++ ? ", " : "") + std::to_string(r);
      abandon((count == 1 ? "rank " : "ranks ") + missing + " did not join " + place + " within " +
              seconds_text(timeout_) + " (rank 0 of " + std::to_string(world_) +
              " waited; a rank that died or never started, or one with another --rendezvous?)");
    }
    // A joined rank sends nothing until it is welcomed: readable means it went away.
    size_t index = 1 + pending.size();
    for (int r = 1; r < world_; ++r)
      if (peers_[r].valid() && fds[index++].revents)
        abandon(rank_text(r) + " joined " + place + " and then went away before every rank had joined");

    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (!fds[1 + i].revents) continue;
      ssize_t got = ::recv(p.socket.fd(), reinterpret_cast<char*>(&p.hello) + p.got, sizeof p.hello - p.got, MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (got < 0 && !net::connection_lost(errno)) throw Error("rank 0: recv: " + errno_text(errno));
      if (got > 0) p.got += static_cast<size_t>(got);
      if (got <= 0 || (p.got == sizeof p.hello && p.hello.magic != net::hello_magic)) {
        p.socket = Socket();  // gone, or a stranger that does not speak the protocol
        continue;
      }
      if (p.got < sizeof p.hello) continue;
      const int r = static_cast<int>(p.hello.rank);
      std::string problem;
      if (static_cast<int>(p.hello.world) != world_)
        problem = "a process joined " + place + " as rank " + std::to_string(p.hello.rank) + " of a world of " +
                  std::to_string(p.hello.world) + " ranks, but rank 0 has a world of " + std::to_string(world_) +
                  ": every rank needs the same world size";
      else if (p.hello.rank == 0 || p.hello.rank >= static_cast<uint32_t>(world_))
        problem = "a process joined " + place + " as rank " + std::to_string(p.hello.rank) + ", outside 1.." +
                  std::to_string(world_ - 1);
      else if (peers_[r].valid())
        problem = "two processes joined " + place + " as rank " + std::to_string(r) +
                  ": each rank must be started once (two jobs on one port?)";
      if (!problem.empty()) {
        peers_.push_back(std::move(p.socket));  // so abandon() tells this one too
        abandon(problem);
      }
      peers_[r] = std::move(p.socket);
      ++joined;
    }
    std::erase_if(pending, [](const Pending& p) { return !p.socket.valid(); });

    if (fds[0].revents) {
      for (;;) {
        Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!s.valid()) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
          throw Error("rank 0 cannot accept connections on " + place + ": " + errno_text(errno));
        }
        set_no_delay(s.fd());
        pending.push_back({std::move(s)});
        if (pending.size() > max_pending) pending.pop_front();
      }
    }
  }

  Frame welcome{net::frame_magic, net::frame_welcome, 0, 0, 0};
  for (int r = 1; r < world_; ++r) {
    IoResult sent = net::send_all(peers_[r].fd(), &welcome, sizeof welcome, deadline);
    if (sent.status != Io::done)
      abandon(rank_text(r) + " went away (" +
              (sent.status == Io::closed ? net::describe_close(sent) : std::string("it stopped reading")) +
              ") while rank 0 welcomed the ranks at " + place);
  }
}

void Rendezvous::guest(const RendezvousSpec& where, Deadline deadline) {
  std::string host = where.host, place = spec_;
  int port = where.port;
  if (where.file) {
    std::string text = read_published(where.path, deadline, rank_, spec_, timeout_);
    std::string problem = split_host_port(text, host, port);
    if (!problem.empty())
      throw Error(rank_text(rank_) + ": the rendezvous file " + where.path + " holds '" + text +
                  "', not HOST:PORT (" + problem + "); remove it and restart the job");
    place = spec_ + " (" + text + ")";
  }
  std::string why = "no attempt was made";
  Socket s;
  for (;;) {
    s = connect_once(host, port, deadline, why);
    if (s.valid()) break;
    int left = net::remaining_ms(deadline);
    if (left == 0)
      throw Error(rank_text(rank_) + " could not reach rank 0 at " + join_host_port(host, port) + " (--rendezvous " +
                  spec_ + ") within " + seconds_text(timeout_) + ": " + why +
                  " (is rank 0 running, and is the address right?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, left)));
  }

  auto lost = [&](const IoResult& r) {
    return Error(rank_text(rank_) + ": rank 0 went away (" + net::describe_close(r) + ") during the rendezvous at " +
                 place);
  };
  auto late = [&] {
    return Error(rank_text(rank_) + " reached rank 0 at " + place + " but not every rank joined within " +
                 seconds_text(timeout_));
  };
  net::Hello hello{net::hello_magic, static_cast<uint32_t>(rank_), static_cast<uint32_t>(world_)};
  IoResult sent = net::send_all(s.fd(), &hello, sizeof hello, deadline);
  if (sent.status == Io::closed) throw lost(sent);
  if (sent.status != Io::done) throw late();
  Frame frame{};
  IoResult got = net::recv_all(s.fd(), &frame, sizeof frame, deadline);
  if (got.status == Io::closed) throw lost(got);
  if (got.status != Io::done) throw late();
  if (frame.magic != net::frame_magic)
    throw Error(rank_text(rank_) + ": what answers at " + place +
                " does not speak the train_yolo rendezvous protocol (is the port used by something else?)");
  if (frame.kind == net::frame_abort)
    throw Error(read_abort_reason(s.fd(), frame, net::deadline_in(1.0), "rank 0"));
  if (frame.kind != net::frame_welcome)
    throw Error(rank_text(rank_) + ": rank 0 at " + place + " sent an unexpected message (kind " +
                std::to_string(frame.kind) + ") instead of its welcome");
  peers_[0] = std::move(s);
}

std::vector<uint8_t> Rendezvous::broadcast_bytes(const std::vector<uint8_t>& from_rank0) {
  if (world_ == 1) return from_rank0;
  if (peers_.empty()) throw Error("broadcast_bytes: this rendezvous has no connections (it failed, or gave them away)");
  Deadline deadline = net::deadline_in(timeout_);
  if (rank_ == 0) {
    Frame frame{net::frame_magic, net::frame_bytes, 0, from_rank0.size(), 0};
    for (int r = 1; r < world_; ++r) {
      IoResult sent = net::send_all(peers_[r].fd(), &frame, sizeof frame, deadline);
      if (sent.status == Io::done) sent = net::send_all(peers_[r].fd(), from_rank0.data(), from_rank0.size(), deadline);
      if (sent.status == Io::closed)
        abandon(rank_text(r) + " went away (" + net::describe_close(sent) + ") before it took rank 0's bytes (" +
                spec_ + ")");
      if (sent.status != Io::done)
        abandon(rank_text(r) + " did not take rank 0's bytes within " + seconds_text(timeout_) + " (" + spec_ + ")");
    }
    return from_rank0;
  }
  const int fd = peers_[0].fd();
  auto check = [&](const IoResult& r) {
    if (r.status == Io::closed)
      throw Error(rank_text(rank_) + ": rank 0 went away (" + net::describe_close(r) + ") before sending its bytes (" +
                  spec_ + ")");
    if (r.status != Io::done)
      throw Error(rank_text(rank_) + " waited " + seconds_text(timeout_) + " for rank 0's bytes (" + spec_ + ")");
  };
  Frame frame{};
  check(net::recv_all(fd, &frame, sizeof frame, deadline));
  if (frame.magic == net::frame_magic && frame.kind == net::frame_abort)
    throw Error(read_abort_reason(fd, frame, deadline, "rank 0"));
  if (frame.magic != net::frame_magic || frame.kind != net::frame_bytes || frame.bytes > (64u << 20))
    throw Error(rank_text(rank_) + ": rank 0 sent something other than its bytes (a mismatched build?)");
  std::vector<uint8_t> bytes(frame.bytes);
  check(net::recv_all(fd, bytes.data(), bytes.size(), deadline));
  return bytes;
}

std::vector<Socket> Rendezvous::take_connections() { return std::exchange(peers_, {}); }

}  // namespace yolo
